"""Every collective TorchRec's sharding types use, timed on the job's group, on gloo ranks
that are threads of this process, or on spawned ranks: the samples ``(kind, D, MB, ms)`` the
collective models are fitted to."""

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
from torchrec_dreamshard.ranks.job_group import JobGroup, group_task
from torchrec_dreamshard.ranks.spawn import measuring_ranks

RANK_KINDS = ("threads", "processes")  # how time_collectives runs its ranks
Sample = tuple[str, int, float, float]  # (kind, D, MB, ms)


def default_backend() -> str:
    """``"nccl"`` where at least two GPUs and NCCL are present, else ``"gloo"``."""
    import torch.distributed as dist

    if torch.cuda.is_available() and torch.cuda.device_count() >= 2 and dist.is_nccl_available():
        return "nccl"
    return "gloo"


@group_task
def _group_collective_samples(group: JobGroup) -> list[tuple]:
    return time_every_collective(group.pg, group.world, group.device)


def group_collective_samples(group: JobGroup) -> tuple[list[Sample], str]:
    """Every collective timed on the job ``group``; a collective's time is its slowest rank's.

    Returns:
        ``(samples, source)``; ``source`` says where they were timed.
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
    """``max_devices`` capped at the machine's GPUs under NCCL, its cores otherwise."""
    if backend == "nccl":
        return min(max_devices, torch.cuda.device_count())
    return measuring_ranks(max_devices)


def time_collectives(
    max_devices: int = 4, backend: str | None = None, ranks: str = "threads"
) -> tuple[list[Sample], str]:
    """Every collective timed on groups of 2..``max_devices`` ranks.

    Args:
        max_devices: the largest group timed (capped by :func:`largest_group`).
        backend: ``"gloo"`` or ``"nccl"`` (default :func:`default_backend`).
        ranks: ``"threads"`` (gloo only: threads of this process, each with its own gloo
            group on loopback TCP) or ``"processes"`` (spawned ranks, one GPU each on NCCL).

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
    name = device_name("cuda" if backend == "nccl" else "cpu")
    return samples, f"{backend} collectives on {name}, 2..{max_devices} ranks ({how})"
