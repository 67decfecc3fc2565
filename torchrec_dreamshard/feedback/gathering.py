"""Every rank's observations of the job, gathered for the report and the re-plan."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from torchrec_dreamshard.feedback.inputs import ObservedInputs, pooling_sums
from torchrec_dreamshard.feedback.sampling import StepSampler
from torchrec_dreamshard.ranks.job_group import JobGroup


def gather(
    sampler: StepSampler,
    group: JobGroup,
    tables: Any,
    with_inputs: bool = False,
    estimates: Any = None,
) -> dict[str, list[Any]]:
    """Every rank's sampled steps, sampling cost, pooling sums, memory snapshot, ``tables``
    and ``estimates``, in one collective; where ``with_inputs``, each rank's recorded
    inputs to rank 0 only (a second collective, up to tens of MB a rank)."""
    sampler.close()
    profiles = sampler.profiles
    mine = {
        "profiles": profiles,
        "overhead": sampler.overhead,
        "sums": pooling_sums(sampler.inputs.steps),
        "tables": tables,
        "memory": sampler.memory.snapshot([p.peak_bytes for p in profiles]),
        "estimates": estimates,
    }
    out: list[Any] = [None] * group.world
    dist.all_gather_object(out, mine, group=group.pg)
    gathered = {key: [o[key] for o in out] for key in mine}
    inputs: list[Any] | None = None
    if with_inputs:
        inputs = [None] * group.world if group.rank == 0 else None
        dist.gather_object(list(sampler.inputs.steps), inputs, group=group.pg, group_dst=0)
    gathered["inputs"] = inputs or []
    return gathered


def observed_inputs(gathered: dict[str, list[Any]], constraints: Any) -> ObservedInputs | None:
    """What the job fed its tables, from :func:`gather`'s result (``None`` where the
    model's tables are unknown)."""
    tables = gathered["tables"][0]
    if tables is None:
        return None
    sums: dict[str, tuple[int, int]] = {}
    for rank in gathered["sums"]:
        for key, (ids, samples) in rank.items():
            total = sums.get(key, (0, 0))
            sums[key] = (total[0] + ids, total[1] + samples)
    return ObservedInputs(tables, sums, constraints, gathered["inputs"])
