"""Every collective TorchRec's sharding types use, each a
:class:`~torchrec_dreamshard.cost.comm_model.CommModel` fitted to this machine's timings
(on the job's own group, or on thread ranks outside a job) and cached.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torchrec_dreamshard.cache.machine_cache import (
    CacheFile,
    load_cached,
    loaded_memo,
    machine_cache_file,
    named_file,
)
from torchrec_dreamshard.cost.comm_model import CommModel, fit_comm_model
from torchrec_dreamshard.measure.collective_timing import COLLECTIVES, check_kind, runs_key
from torchrec_dreamshard.measure.collectives import (
    default_backend,
    group_collective_samples,
    largest_group,
    time_collectives,
)
from torchrec_dreamshard.measure.spent import spent_on
from torchrec_dreamshard.ranks.job_group import JobGroup, active_group

FORMAT_VERSION = 1  # of the cache file; a reader refuses other versions


@dataclass
class CollectiveModels:
    """One fitted :class:`CommModel` per collective, for one backend.

    Args:
        backend: ``"gloo"``, ``"nccl"`` or ``"analytic"``.
        hosts: hosts the timed ranks spanned; above 1 the fit holds the cross-host links.
    """

    backend: str
    models: dict[str, CommModel]
    source: str = ""
    version: int = field(default=FORMAT_VERSION)
    hosts: int = 1

    def __post_init__(self) -> None:
        missing = [k for k in COLLECTIVES if k not in self.models]
        if missing:
            raise ValueError(f"collective models lack {missing}; expected all of {COLLECTIVES}")

    def ms(self, kind: str, num_devices: int, megabytes: float) -> float:
        """One ``kind`` collective's ms for a rank moving ``megabytes`` (0 for one rank)."""
        return self.models[check_kind(kind)].collective_ms(num_devices, megabytes)

    def to_dict(self) -> dict[str, Any]:
        models = {k: asdict(m) for k, m in self.models.items()}
        return {
            "version": self.version,
            "backend": self.backend,
            "source": self.source,
            "hosts": self.hosts,
            "models": models,
        }

    @classmethod
    def from_dict(cls, data: Any) -> CollectiveModels:
        if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
            found = data.get("version") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"collective models need format version {FORMAT_VERSION}, got {found}")
        try:
            models = {k: CommModel(**v) for k, v in data["models"].items()}
            return cls(
                backend=data["backend"],
                models=models,
                source=data.get("source", ""),
                hosts=int(data.get("hosts", 1)),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"collective models are malformed ({exc!r})") from None


@spent_on("collectives")
def fit_group_collectives(group: JobGroup) -> CollectiveModels:
    """Time every collective on the driven job group and fit the models."""
    samples, source = group_collective_samples(group)
    models = fit_collective_models(samples, group.backend, source)
    models.hosts = len(set(group.hosts))
    return models


def fit_collective_models(
    samples: Sequence[tuple[str, int, float, float]], backend: str, source: str
) -> CollectiveModels:
    """One least-squares :class:`CommModel` per collective from ``(kind, D, MB, ms)``."""
    models = {}
    for kind in COLLECTIVES:
        rows = [(d, mb, ms) for k, d, mb, ms in samples if k == kind]
        models[kind] = fit_comm_model(rows, f"{source}: {kind}", what=kind)
    return CollectiveModels(backend=backend, models=models, source=source)


@spent_on("collectives")
def calibrate_collective_models(
    max_devices: int = 4, backend: str | None = None, ranks: str = "threads"
) -> CollectiveModels:
    """Time every collective on groups of 2..``max_devices`` ranks and fit them."""
    backend = backend or default_backend()
    samples, source = time_collectives(max_devices, backend, ranks)
    return fit_collective_models(samples, backend, source)


MAX_RANKS = 4  # the largest group the fit outside a job times (2..MAX_RANKS ranks)


def _device(backend: str) -> str:
    return "cuda" if backend == "nccl" else "cpu"


def _ranks(backend: str) -> str:
    """How the fit outside a job starts its ranks for ``backend``."""
    return "threads" if backend == "gloo" else "processes"


def collectives_cache_file(backend: str | None = None) -> CacheFile:
    """This machine's cache file of the models fitted outside a job with ``backend``."""
    backend = backend or default_backend()
    largest = largest_group(MAX_RANKS, backend)
    topology = {"backend": backend, "ranks": _ranks(backend), "max_ranks": largest}
    extra = {"format": FORMAT_VERSION, "topology": topology, "runs": runs_key()}
    return machine_cache_file("collectives", _device(backend), backend, **extra)


def default_collectives_path(backend: str | None = None) -> Path:
    """Where :func:`collectives_cache_file` is."""
    return collectives_cache_file(backend).path


_LOADED: dict[str, CollectiveModels] = loaded_memo()


def load_collective_models(
    path: str | os.PathLike | None = None, backend: str | None = None
) -> CollectiveModels:
    """The fitted models from ``path`` (default :func:`default_collectives_path`), measured
    and saved first when the file is missing."""
    backend = backend or default_backend()
    file = named_file(path) if path is not None else collectives_cache_file(backend)
    ranks = _ranks(backend)
    return load_cached(
        file,
        "collective models file",
        CollectiveModels.from_dict,
        lambda: calibrate_collective_models(MAX_RANKS, backend, ranks),
        CollectiveModels.to_dict,
        _LOADED,
    )


def group_collectives_file(backend: str, hosts: Sequence[str]) -> CacheFile:
    """This machine's cache file of the models measured on a job group on ``hosts``."""
    label = f"{backend}_{len(hosts)}ranks"
    topology = group_topology_key(backend, hosts)
    extra = {"format": FORMAT_VERSION, "topology": topology, "runs": runs_key()}
    return machine_cache_file("collectives", _device(backend), label, **extra)


def group_topology_key(backend: str, hosts: Sequence[str]) -> dict[str, Any]:
    """The topology key of a job-group measurement: backend, world size, rank 0's host, hosts."""
    hosts = list(hosts)
    return {
        "backend": backend,
        "world_size": len(hosts),
        "local_world_size": hosts.count(hosts[0]) if hosts else 0,
        "hosts": hosts,
    }


def load_group_collectives(group: JobGroup) -> CollectiveModels:
    """The models measured on the driven job ``group`` (measured first when not cached)."""
    file = group_collectives_file(group.backend, group.hosts)
    return load_cached(
        file,
        "collective models file",
        CollectiveModels.from_dict,
        lambda: fit_group_collectives(group),
        CollectiveModels.to_dict,
        _LOADED,
    )


def load_all_to_all_model(path: str | os.PathLike | None = None) -> CommModel:
    """The all-to-all model: from ``path``, else the driven job group's, else the gloo fit."""
    group = active_group() if path is None else None
    if group is not None:
        return load_group_collectives(group).models["all_to_all"]
    return load_collective_models(path, backend="gloo").models["all_to_all"]


def local_all_to_all(
    num_devices: int, backend: str = "local", path: str | os.PathLike | None = None
) -> CommModel | None:
    """The all-to-all model ``measure_placement``'s local backend charges (more than one
    device), else ``None``."""
    if backend != "local" or num_devices <= 1:
        return None
    return load_all_to_all_model(path)
