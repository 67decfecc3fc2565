"""Every collective TorchRec's sharding types use, modelled: fitted to this machine's
timings (:mod:`torchrec_dreamshard.measure.collectives` takes them) and cached.

Each collective is fitted to the latency-bandwidth form of
:class:`~torchrec_dreamshard.cost.comm_model.CommModel`

    t(D, MB) = a + b * (D - 1) + c * MB        (ms; one collective among D ranks)

where ``MB`` (1e6 bytes) is what one rank sends plus receives under the collective's
bandwidth-optimal algorithm, so that every collective is on the same axis. For a buffer of
``S`` bytes on each of ``D`` ranks:

* all-to-all of ``S`` bytes per rank, evenly split: ``2 (D - 1) / D * S`` (its own slice
  stays; uneven all-to-alls count the bytes they actually move);
* reduce-scatter of an ``S``-byte input (``S / D`` out): ``2 (D - 1) / D * S``;
* all-gather into an ``S``-byte output (``S / D`` in): ``2 (D - 1) / D * S``;
* all-reduce of ``S`` bytes (a reduce-scatter then an all-gather): ``4 (D - 1) / D * S``.

``a, b, c`` are least squares over timings, clipped at 0. Which timings:

* inside a distributed job planning with ``collective_plan`` (:func:`load_group_collectives`):
  the job's own process group's; the group has one size ``D = W``, so ``b`` is 0 and ``a``
  holds the whole fixed cost at that size. Cached per machine and topology (world size and
  hosts).
* elsewhere (:func:`load_collective_models`): groups of 2..``max_devices`` ranks that are
  threads of this process (no process is started; spawned ranks on request). Cached per
  machine and backend.

The all-to-all model fitted here is the package's one model of an all-to-all's time
(:func:`load_all_to_all_model`): callers of the local measurement backend hand it over
for the backend to charge, the calibration sets the cost network's all-to-all head to it,
and the planner prices every sharding type's all-to-alls with it.
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
        backend: ``"gloo"`` or ``"nccl"`` (or ``"analytic"`` for models built from
            bandwidths rather than timings).
        models: collective name -> its ``t(D, MB)`` model.
        source: how the models were obtained.
        hosts: hosts the timed ranks spanned: above 1 (a job's own group over several
            hosts), the fit holds the cross-host links too, and the topology's analytic
            cross-host term is not added to it.
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
        """One ``kind`` collective's ms for a rank moving ``megabytes`` among
        ``num_devices`` ranks (0 for one rank)."""
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
    """Time every collective on the driven job group (every rank taking part:
    :func:`~torchrec_dreamshard.measure.collectives.group_collective_samples`) and fit
    the models."""
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
    """Time every collective on groups of 2..``max_devices`` ranks and fit their models
    (the timing, its arguments and what it refuses:
    :func:`~torchrec_dreamshard.measure.collectives.time_collectives`)."""
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
    """This machine's cache file of the models fitted outside a job with ``backend``: keyed
    by :func:`~torchrec_dreamshard.cache.machine_cache.measurement_key`, the backend, how
    the ranks run (threads or processes) and the largest group timed (at most
    :data:`MAX_RANKS`, fewer on a machine of fewer cores or GPUs)."""
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
    """The fitted models from ``path`` (default :func:`default_collectives_path`),
    calibrating and saving them first when the file does not exist: gloo's on ranks that
    are threads of this process (no process is started), NCCL's on spawned ranks (never
    on the planner's path: it prices GPU ranks outside a job analytically)."""
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
    """This machine's cache file of the models measured on a job group of ``len(hosts)``
    ranks on ``hosts`` (rank order) with ``backend``: keyed by
    :func:`~torchrec_dreamshard.cache.machine_cache.measurement_key` and the topology
    (backend, world size, ranks on rank 0's host, the hosts)."""
    label = f"{backend}_{len(hosts)}ranks"
    topology = group_topology_key(backend, hosts)
    extra = {"format": FORMAT_VERSION, "topology": topology, "runs": runs_key()}
    return machine_cache_file("collectives", _device(backend), label, **extra)


def group_topology_key(backend: str, hosts: Sequence[str]) -> dict[str, Any]:
    """What a measurement on a job group of ``len(hosts)`` ranks on ``hosts`` (rank order)
    with ``backend`` is keyed by beside the machine: the backend, the world size, the ranks
    on rank 0's host and the hosts."""
    hosts = list(hosts)
    return {
        "backend": backend,
        "world_size": len(hosts),
        "local_world_size": hosts.count(hosts[0]) if hosts else 0,
        "hosts": hosts,
    }


def group_collectives_path(backend: str, hosts: Sequence[str]) -> Path:
    """Where :func:`group_collectives_file` is."""
    return group_collectives_file(backend, hosts).path


def load_group_collectives(group: JobGroup) -> CollectiveModels:
    """The models measured on the driven job ``group`` (cached per machine and topology:
    :func:`group_collectives_path`), measuring them on the group first when there is no
    cache file. Every rank's call is the same group request, so rank 0 decides."""
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
    """The machine's all-to-all model: the all-to-all of the collective models in ``path``
    (default: this machine's gloo fit, :func:`load_collective_models`, measured first where
    it is not cached); without ``path``, while rank 0 of a job drives measurements on the
    job's group, the one measured on that group (:func:`load_group_collectives`)."""
    group = active_group() if path is None else None
    if group is not None:
        return load_group_collectives(group).models["all_to_all"]
    return load_collective_models(path, backend="gloo").models["all_to_all"]


def local_all_to_all(
    num_devices: int, backend: str = "local", path: str | os.PathLike | None = None
) -> CommModel | None:
    """What to hand :func:`~torchrec_dreamshard.measure.placement_timing.measure_placement`
    as ``comm``: the machine's all-to-all model (:func:`load_all_to_all_model` of
    ``path``) where the local backend charges one, that is over more than one device;
    ``None`` for one device or the distributed backend (which times the real all-to-all),
    so that nothing is loaded or measured that the measurement does not charge."""
    if backend != "local" or num_devices <= 1:
        return None
    return load_all_to_all_model(path)
