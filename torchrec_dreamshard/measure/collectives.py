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
* elsewhere (:func:`load_collective_models`): on 2..``max_devices`` spawned ranks, never more
  than the machine's cores, with a clean environment (no launcher's rendezvous), and never
  from inside a distributed job. Cached per machine and backend.

The all-to-all model fitted here is the package's one model of an all-to-all's time
(:func:`load_all_to_all_model`): the local measurement backend charges it, the calibration
sets the cost network's all-to-all head to it, and the planner prices every sharding
type's all-to-alls with it.

The backend is gloo on CPU and NCCL where at least two GPUs are present; the NCCL path
(one GPU per rank, timings synchronised on the device) is written to be right but is
unmeasured here, where there is no GPU.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

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
    check_may_spawn,
    free_port,
    launcher_free_env,
    local_process_group,
    measuring_ranks,
)

COLLECTIVES = ("all_to_all", "reduce_scatter", "all_gather", "all_reduce")
FORMAT_VERSION = 1  # of the cache file; a reader refuses other versions
_WIRE_FACTOR = {"all_to_all": 2.0, "reduce_scatter": 2.0, "all_gather": 2.0, "all_reduce": 4.0}
_CALIBRATION_BYTES = (2**14, 2**17, 2**20, 2**22)  # buffer bytes per rank: 16 KB .. 4 MB
_CALIBRATION_REPEATS = 5


def check_kind(kind: str) -> str:
    """``kind`` if it names a collective, else a ``ValueError`` listing the names."""
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective {kind!r}; expected one of {list(COLLECTIVES)}")
    return kind


def wire_megabytes(kind: str, num_devices: int, buffer_bytes: float) -> float:
    """MB one rank sends plus receives in ``kind`` over ``num_devices`` ranks with a buffer
    of ``buffer_bytes`` per rank (see the module docstring; 0 for one rank)."""
    check_kind(kind)
    if num_devices <= 1:
        return 0.0
    return _WIRE_FACTOR[kind] * (num_devices - 1) / num_devices * buffer_bytes / 1e6


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


def _buffers(
    kind: str, numel: int, num_devices: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input, output)`` of ``kind`` for a buffer of ``numel`` elements per rank
    (``numel`` a multiple of ``num_devices``; the all-reduce works in place)."""
    part = numel // num_devices
    if kind == "reduce_scatter":
        return torch.rand(numel, device=device), torch.empty(part, device=device)
    if kind == "all_gather":
        return torch.rand(part, device=device), torch.empty(numel, device=device)
    full = torch.rand(numel, device=device)
    return full, (torch.empty(numel, device=device) if kind == "all_to_all" else full)


def _run(kind: str, inp: torch.Tensor, out: torch.Tensor, group) -> None:
    import torch.distributed as dist

    if kind == "all_to_all":
        dist.all_to_all_single(out, inp, group=group)
    elif kind == "reduce_scatter":
        getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(out, inp, group=group)
    elif kind == "all_gather":
        getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(out, inp, group=group)
    else:
        dist.all_reduce(inp, group=group)


def time_collective(
    kind: str, buffer_bytes: int, iters: int, warmup: int = 1, group=None, device=None
) -> list[float]:
    """Time ``kind`` with a buffer of about ``buffer_bytes`` per rank (fp32) on an
    initialised group; every rank of ``group`` must call it with the same arguments.

    Each run starts after a barrier, so a rank's time is from the common start to its own
    completion (with a device synchronisation on CUDA).

    Returns:
        ``iters`` figures in ms for this rank.
    """
    import torch.distributed as dist

    device = device or torch.device("cpu")
    d = dist.get_world_size(group)
    numel = max(1, round(buffer_bytes / 4 / d)) * d
    inp, out = _buffers(check_kind(kind), numel, d, device)
    times = []
    for i in range(warmup + iters):
        dist.barrier(group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        _run(kind, inp, out, group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def _calibration_worker(rank: int, world: int, port: int, out_path: str, backend: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    samples = []
    with local_process_group(rank, world, port, backend=backend):
        for d in range(2, world + 1):
            group = dist.new_group(list(range(d)))
            if rank >= d:
                continue
            samples += _time_every_collective(group, d, device)
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(samples, gathered, dst=0)
        if rank == 0:
            Path(out_path).write_text(json.dumps([s for part in gathered for s in part]))


def _time_every_collective(group, d: int, device: torch.device) -> list[tuple]:
    """``(kind, D, MB, median ms)`` of every collective and calibration size, on this
    rank of ``group`` (``d`` ranks; every rank calls it)."""
    samples = []
    for kind in COLLECTIVES:
        for size in _CALIBRATION_BYTES:
            t = time_collective(kind, size, _CALIBRATION_REPEATS, group=group, device=device)
            samples.append((kind, d, wire_megabytes(kind, d, size), statistics.median(t)))
    return samples


@group_task
def _group_collective_samples(group: JobGroup) -> list[tuple]:
    return _time_every_collective(group.pg, group.world, group.device)


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


def calibrate_collective_models(
    max_devices: int = 4, backend: str | None = None
) -> CollectiveModels:
    """Time every collective on 2..``max_devices`` spawned ranks (at most the machine's
    cores, or its GPUs under NCCL) and fit their models.

    The timings take a few seconds; starting the processes takes most of the rest.

    Raises:
        ValueError: called from inside a distributed job (nothing is spawned there), or
            ``max_devices < 2``.
    """
    import tempfile

    import torch.multiprocessing as mp

    check_may_spawn("timing the collectives")
    if max_devices < 2:
        raise ValueError(f"max_devices must be >= 2, got {max_devices}")
    backend = backend or default_backend()
    if backend == "nccl":
        max_devices = min(max_devices, torch.cuda.device_count())
    else:
        max_devices = measuring_ranks(max_devices)
    with tempfile.TemporaryDirectory() as tmp, launcher_free_env():
        out = os.path.join(tmp, "samples.json")
        args = (max_devices, free_port(), out, backend)
        mp.spawn(_calibration_worker, args=args, nprocs=max_devices)
        samples = json.loads(Path(out).read_text())
    source = f"{backend} collectives on {_device_name(backend)}, 2..{max_devices} ranks"
    return fit_collective_models([tuple(s) for s in samples], backend, source)


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
    calibrating and saving them first when the file does not exist."""
    backend = backend or default_backend()
    path = Path(path) if path is not None else default_collectives_path(backend)
    return load_cached(
        path,
        "collective models file",
        CollectiveModels.from_dict,
        lambda: calibrate_collective_models(backend=backend),
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
