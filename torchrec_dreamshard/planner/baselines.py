"""TorchRec's planner as a placer (:func:`torchrec_placement`): the baseline DreamShard is
compared with, and a candidate of its safety net (:mod:`torchrec_dreamshard.planner.candidates`).

``torchrec``: TorchRec's own ``EmbeddingShardingPlanner`` restricted to table-wise fused
sharding, given the pooling factors, the batch size and the memory in its ``Topology``,
with its default storage reservation (15% heuristic) and storage estimate (optimizer
state, I/O buffers): it finds no plan at all when memory is tight. ``torchrec_ours``
(``ours=True``): the same planner with our memory accounting (a table costs its weights'
bytes, nothing is reserved), so it always competes.

Every placer by name, these two among them, is in
:mod:`torchrec_dreamshard.evaluation.placers`; the heuristics are in
:mod:`torchrec_dreamshard.policy.heuristics` and the measured search (the expensive
headroom reference) in :mod:`torchrec_dreamshard.evaluation.measured_search`.
"""

from __future__ import annotations

import dataclasses

from torchrec_dreamshard.data.tasks import NoPlanError, Task, check_placement

# ----------------------------------------------------------------------------------------
# TorchRec's planner
# ----------------------------------------------------------------------------------------


def torchrec_placement(task: Task, seed: int = 0, ours: bool = False) -> list[int]:
    """TorchRec's ``EmbeddingShardingPlanner``, table-wise fused sharding only (see
    :func:`torchrec_dreamshard.planner.torchrec_adapter.plan_with_torchrec`).

    Args:
        task: the task (its batch is the global batch; TorchRec gets ``B / D`` per rank).
        seed: unused (the planner is deterministic).
        ours: use our memory accounting (weights' bytes only, no reservation) instead of
            TorchRec's defaults.

    Raises:
        NoPlanError: TorchRec's planner found no plan (its message is kept).
    """
    from torchrec.distributed.planner.types import PlannerError

    from torchrec_dreamshard.planner.torchrec_adapter import plan_with_torchrec

    # module names may not hold dots (a planner's tables are named by their FQN): plan
    # tables named t0, t1, ... and map the ranks back by position
    renamed = Task(
        tables=[dataclasses.replace(t, name=f"t{i}") for i, t in enumerate(task.tables)],
        num_devices=task.num_devices,
        memory_bytes=list(task.memory),
        batch_size=task.batch_size,
    )
    try:
        ranks = plan_with_torchrec(renamed, weights_only=ours)
    except PlannerError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NoPlanError(f"TorchRec's planner found no plan: {first}") from None
    missing = [
        t.name for t, r in zip(task.tables, renamed.tables, strict=True) if r.name not in ranks
    ]
    if missing:
        raise NoPlanError(f"TorchRec's plan has no rank for tables {missing}")
    return check_placement(task, [ranks[t.name] for t in renamed.tables])
