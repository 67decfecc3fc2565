"""Every collective TorchRec's sharding types use, timed: the raw samples the collective
models (:mod:`torchrec_dreamshard.cost.collective_models`) are fitted to.

The four collectives are the all-to-all (table-wise and column-wise outputs, every input
distribution), the reduce-scatter (row-wise pooled outputs, forward), the all-gather
(their gradients, backward) and the all-reduce (data-parallel gradients). A sample is
``(kind, D, MB, ms)``: one collective among ``D`` ranks, ``MB`` what one rank sends plus
receives under the collective's bandwidth-optimal algorithm
(:func:`~torchrec_dreamshard.measure.collective_timing.wire_megabytes`). Where they are
timed:

* on a distributed job's own process group (:func:`group_collective_samples`), every rank
  taking part, with its real backend and hosts; a collective's time is its slowest rank's;
* elsewhere (:func:`time_collectives`): on groups of 2..``max_devices`` ranks, never more
  than the machine's cores, each rank a thread of this process with a gloo process group
  of its own over an in-process store and loopback TCP (the default process group
  untouched), so that a library call starts no process: a script without a main guard, a
  notebook or a debugger plans as they would with TorchRec's planner. The ``dreamshard``
  commands may time them on spawned ranks instead (``ranks="processes"``, with a clean
  environment and never from inside a distributed job; the only way for NCCL).

Threads or processes: between gloo ranks on one machine both move the same bytes over
loopback TCP through the same gloo code. On our 2-core machine, under load, threads fitted
about the same ``ms_per_mb`` as spawned ranks (within the run-to-run noise of either) and a
fixed cost no larger, often smaller (up to about 0.5 ms a collective: waking a thread of
the same process is cheaper than waking another process), in under 1 s instead of about 7
(each spawned rank imports torch); ``benchmarks/collective_ranks.py``, figures in
``docs/guide.md``. The analytic model of the topology's bandwidths, the other choice that
spawns nothing, prices a 4 MB gloo all-to-all about a thousand times short, so threads it
is. A job's own group measures the real thing.

The backend is gloo on CPU and NCCL where at least two GPUs are present; the NCCL path
(one GPU per rank, timings synchronised on the device) is written to be right but is
unmeasured here, where there is no GPU.
"""

from __future__ import annotations

import torch

from torchrec_dreamshard.measure.collective_timing import (
    spawned_samples,
    thread_samples,
    time_every_collective,
)
from torchrec_dreamshard.measure.gate import check_may_measure
from torchrec_dreamshard.measure.group_tasks import run_on_group
from torchrec_dreamshard.measure.hardware import device_name
from torchrec_dreamshard.ranks.job_group import (
    JobGroup,
    group_task,
)
from torchrec_dreamshard.ranks.spawn import measuring_ranks

RANK_KINDS = ("threads", "processes")  # how time_collectives runs its ranks
Sample = tuple[str, int, float, float]  # (kind, D, MB, ms)


def default_backend() -> str:
    """``"nccl"`` where at least two GPUs and NCCL are present, else ``"gloo"``."""
    import torch.distributed as dist

    if torch.cuda.is_available() and torch.cuda.device_count() >= 2 and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def backend_device_name(backend: str) -> str:
    """The device a ``backend``'s collectives run on (what their cache files are named by)."""
    return device_name("cuda" if backend == "nccl" else "cpu")


@group_task
def _group_collective_samples(group: JobGroup) -> list[tuple]:
    return time_every_collective(group.pg, group.world, group.device)


def group_collective_samples(group: JobGroup) -> tuple[list[Sample], str]:
    """Every collective timed on the driven job ``group`` (every rank taking part).

    Returns:
        ``(samples, source)``: a collective's time is its slowest rank's; ``source`` says
        where they were timed.
    """
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
    return samples, source


def largest_group(max_devices: int, backend: str) -> int:
    """The largest group :func:`time_collectives` times when asked for ``max_devices``
    ranks: at most the machine's GPUs under NCCL, its cores otherwise."""
    if backend == "nccl":
        return min(max_devices, torch.cuda.device_count())
    return measuring_ranks(max_devices)


def time_collectives(
    max_devices: int = 4, backend: str | None = None, ranks: str = "threads"
) -> tuple[list[Sample], str]:
    """Every collective timed on groups of 2..``max_devices`` ranks (at most the
    machine's cores, or its GPUs under NCCL).

    Args:
        max_devices: the largest group timed.
        backend: ``"gloo"`` or ``"nccl"`` (default :func:`default_backend`).
        ranks: ``"threads"`` (gloo only): each rank a thread of this process with its own
            gloo process group over an in-process store, on loopback TCP as between
            processes, so that nothing is spawned and the default process group is left
            alone; ``"processes"``: each rank a spawned process (NCCL's only way, one GPU
            each; the comparison in ``benchmarks/collective_ranks.py``).

    The timings take a few seconds; spawned processes add their start-up (each imports
    torch) to it.

    Returns:
        ``(samples, source)``; ``source`` says where they were timed.

    Raises:
        ValueError: ``max_devices < 2``, ``ranks`` unknown or ``"threads"`` with NCCL, or
            processes would be spawned from inside a distributed job.
    """
    check_may_measure("time_collectives")
    if max_devices < 2:
        raise ValueError(f"max_devices must be >= 2, got {max_devices}")
    if ranks not in RANK_KINDS:
        raise ValueError(f"ranks must be one of {RANK_KINDS}, got {ranks!r}")
    backend = backend or default_backend()
    if backend == "nccl" and ranks == "threads":
        raise ValueError(
            "NCCL collectives are timed on spawned processes (one GPU each); pass ranks='processes'"
        )
    max_devices = largest_group(max_devices, backend)
    if ranks == "threads":
        samples = thread_samples(max_devices)
        how = "threads of one process"
    else:
        samples = spawned_samples(max_devices, backend)
        how = "spawned processes"
    name = backend_device_name(backend)
    return samples, f"{backend} collectives on {name}, 2..{max_devices} ranks ({how})"
