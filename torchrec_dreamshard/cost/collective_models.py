"""Every collective TorchRec's sharding types use, timed on this machine and modelled.

The four collectives are the all-to-all (table-wise and column-wise outputs, every input
distribution), the reduce-scatter (row-wise pooled outputs, forward), the all-gather
(their gradients, backward) and the all-reduce (data-parallel gradients). Each is fitted
to the latency-bandwidth form of :class:`~torchrec_dreamshard.measure.comm.CommModel`

    t(D, MB) = a + b * (D - 1) + c * MB        (ms; one collective among D ranks)

where ``MB`` (1e6 bytes) is what one rank sends plus receives under the collective's
bandwidth-optimal algorithm, so that every collective is on the same axis. For a buffer of
``S`` bytes on each of ``D`` ranks:

* all-to-all of ``S`` bytes per rank, evenly split: ``2 (D - 1) / D * S`` (its own slice
  stays; uneven all-to-alls count the bytes they actually move);
* reduce-scatter of an ``S``-byte input (``S / D`` out): ``2 (D - 1) / D * S``;
* all-gather into an ``S``-byte output (``S / D`` in): ``2 (D - 1) / D * S``;
* all-reduce of ``S`` bytes (a reduce-scatter then an all-gather): ``4 (D - 1) / D * S``.

``a, b, c`` are least squares over timings, clipped at 0. Where they are timed:

* inside a distributed job planning with ``collective_plan`` (:func:`load_group_collectives`):
  on the job's own process group, every rank taking part, with its real backend and hosts;
  the group has one size ``D = W``, so ``b`` is 0 and ``a`` holds the whole fixed cost at
  that size. Cached per machine and topology (world size and hosts).
* elsewhere (:func:`load_collective_models`): on groups of 2..``max_devices`` gloo ranks,
  never more than the machine's cores, each rank a thread of this process with a gloo
  process group of its own over an in-process store and loopback TCP (the default process
  group untouched), so that a library call starts no process: a script without a main
  guard, a notebook or a debugger plans as they would with TorchRec's planner. Cached per
  machine and backend. The ``dreamshard`` commands may time them on spawned ranks instead
  (``ranks="processes"``, with a clean environment and never from inside a distributed
  job; the only way for NCCL).

Threads or processes: between gloo ranks on one machine both move the same bytes over
loopback TCP through the same gloo code. On our 2-core machine, under load, threads fitted
about the same ``ms_per_mb`` as spawned ranks (within the run-to-run noise of either) and a
fixed cost no larger, often smaller (up to about 0.5 ms a collective: waking a thread of
the same process is cheaper than waking another process), in under 1 s instead of about 7
(each spawned rank imports torch); ``benchmarks/collective_ranks.py``, figures in
``docs/guide.md``. The analytic model of the
topology's bandwidths, the other choice that spawns nothing, prices a 4 MB gloo all-to-all
about a thousand times short, so threads it is. A job's own group (``collective_plan``)
measures the real thing.

The all-to-all model fitted here is the package's one model of an all-to-all's time
(:func:`load_all_to_all_model`): the local measurement backend charges it, the calibration
sets the cost network's all-to-all head to it, and the planner prices every sharding
type's all-to-alls with it.

The backend is gloo on CPU and NCCL where at least two GPUs are present; the NCCL path
(one GPU per rank, timings synchronised on the device) is written to be right but is
unmeasured here, where there is no GPU.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from torchrec_dreamshard.measure.collective_timing import (
    COLLECTIVES,
    check_kind,
    spawned_samples,
    thread_samples,
    time_every_collective,
)
from torchrec_dreamshard.measure.comm import CommModel, fit_comm_model
from torchrec_dreamshard.measure.config import stable_key
from torchrec_dreamshard.measure.distributed_job_group import (
    JobGroup,
    active_group,
    group_task,
    run_on_group,
)
from torchrec_dreamshard.measure.hardware import device_name
from torchrec_dreamshard.measure.machine_cache import load_cached, machine_cache_path
from torchrec_dreamshard.measure.spawn import (
    measuring_ranks,
)
from torchrec_dreamshard.measure.spent import spent_on

FORMAT_VERSION = 1  # of the cache file; a reader refuses other versions
RANK_KINDS = ("threads", "processes")  # how calibrate_collective_models runs its ranks


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


def default_backend() -> str:
    """``"nccl"`` where at least two GPUs and NCCL are present, else ``"gloo"``."""
    import torch.distributed as dist

    if torch.cuda.is_available() and torch.cuda.device_count() >= 2 and dist.is_nccl_available():
        return "nccl"
    return "gloo"


@group_task
def _group_collective_samples(group: JobGroup) -> list[tuple]:
    return time_every_collective(group.pg, group.world, group.device)


@spent_on("collectives")
def measure_group_collectives(group: JobGroup) -> CollectiveModels:
    """Time every collective on the driven job group (every rank taking part) and fit
    the models; a collective's time is its slowest rank's."""
    per_rank = run_on_group(_group_collective_samples)
    samples = [
        (kind, d, mb, max(rank[i][3] for rank in per_rank))
        for i, (kind, d, mb, _) in enumerate(per_rank[0])
    ]
    name = device_name(group.device)
    hosts = len(set(group.hosts))
    source = (
        f"{group.backend} collectives on the job's {group.world} ranks, {hosts} host(s) ({name})"
    )
    models = fit_collective_models(samples, group.backend, source)
    models.hosts = hosts
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
    """Time every collective on groups of 2..``max_devices`` ranks (at most the machine's
    cores, or its GPUs under NCCL) and fit their models.

    Args:
        max_devices: the largest group timed.
        backend: ``"gloo"`` or ``"nccl"`` (default :func:`default_backend`).
        ranks: ``"threads"`` (gloo only): each rank a thread of this process with its own
            gloo process group over an in-process store, on loopback TCP as between
            processes, so that nothing is spawned and the default process group is left
            alone (what a library call does: :func:`load_collective_models`);
            ``"processes"``: each rank a spawned process (NCCL's only way, one GPU each;
            the comparison in ``benchmarks/collective_ranks.py``).

    The timings take a few seconds; spawned processes add their start-up (each imports
    torch) to it.

    Raises:
        ValueError: ``max_devices < 2``, ``ranks`` unknown or ``"threads"`` with NCCL, or
            processes would be spawned from inside a distributed job.
    """
    if max_devices < 2:
        raise ValueError(f"max_devices must be >= 2, got {max_devices}")
    if ranks not in RANK_KINDS:
        raise ValueError(f"ranks must be one of {RANK_KINDS}, got {ranks!r}")
    backend = backend or default_backend()
    if backend == "nccl":
        if ranks == "threads":
            raise ValueError(
                "NCCL collectives are timed on spawned processes (one GPU each); pass "
                "ranks='processes'"
            )
        max_devices = min(max_devices, torch.cuda.device_count())
    else:
        max_devices = measuring_ranks(max_devices)
    if ranks == "threads":
        samples = thread_samples(max_devices)
        how = "threads of one process"
    else:
        samples = spawned_samples(max_devices, backend)
        how = "spawned processes"
    source = f"{backend} collectives on {_device_name(backend)}, 2..{max_devices} ranks ({how})"
    return fit_collective_models(samples, backend, source)


def _device_name(backend: str) -> str:
    return device_name("cuda" if backend == "nccl" else "cpu")


def default_collectives_path(backend: str | None = None) -> Path:
    """Per-machine, per-backend cache file of the fitted models
    (:func:`~torchrec_dreamshard.measure.machine_cache.machine_cache_path`)."""
    backend = backend or default_backend()
    return machine_cache_path(f"collectives_{backend}", _device_name(backend))


_LOADED: dict[str, CollectiveModels] = {}


def load_collective_models(
    path: str | os.PathLike | None = None, backend: str | None = None
) -> CollectiveModels:
    """The fitted models from ``path`` (default :func:`default_collectives_path`),
    calibrating and saving them first when the file does not exist: gloo's on ranks that
    are threads of this process (no process is started), NCCL's on spawned ranks (never
    on the planner's path: it prices GPU ranks outside a job analytically)."""
    backend = backend or default_backend()
    path = Path(path) if path is not None else default_collectives_path(backend)
    ranks = "threads" if backend == "gloo" else "processes"
    return load_cached(
        path,
        "collective models file",
        CollectiveModels.from_dict,
        lambda: calibrate_collective_models(backend=backend, ranks=ranks),
        CollectiveModels.to_dict,
        _LOADED,
    )


def group_collectives_path(backend: str, hosts: Sequence[str]) -> Path:
    """Cache file of the models measured on a job group of ``len(hosts)`` ranks on
    ``hosts`` (rank order) with ``backend``: per machine and topology."""
    topology = stable_key([len(hosts), list(hosts)])
    kind = f"collectives_{backend}_{len(hosts)}ranks_{topology}"
    return machine_cache_path(kind, _device_name(backend))


def load_group_collectives(group: JobGroup) -> CollectiveModels:
    """The models measured on the driven job ``group`` (cached per machine and topology:
    :func:`group_collectives_path`), measuring them on the group first when there is no
    cache file. Every rank's call is the same group request, so rank 0 decides."""
    path = group_collectives_path(group.backend, group.hosts)
    return load_cached(
        path,
        "collective models file",
        CollectiveModels.from_dict,
        lambda: measure_group_collectives(group),
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
