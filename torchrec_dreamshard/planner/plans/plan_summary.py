"""A plan as ``dreamshard plan`` summarises it (:func:`plan_summary`): its layout, the
predicted step and each device's tables, bytes and predicted times."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from torchrec.distributed.planner.types import ShardingOption
from torchrec.distributed.types import ShardingPlan

from torchrec_dreamshard.planner.adapters.device_memory import rank_bytes
from torchrec_dreamshard.planner.plans.plan_prediction import PlanPrediction
from torchrec_dreamshard.planner.stages.option_kinds import (
    DREAMSHARD_COMPUTE_KERNEL,
    DREAMSHARD_SHARDING_TYPE,
    SPLIT_SHARDING_TYPE,
)


def table_layout(plan: ShardingPlan) -> dict[str, dict[str, Any]]:
    """Every table of ``plan`` by name: its type, kernel, ranks and ``[rank, offset, size]``
    shards."""
    out = {}
    for module_plan in plan.plan.values():
        for name, ps in module_plan.items():  # type: ignore[union-attr]
            shards = [] if ps.sharding_spec is None else ps.sharding_spec.shards
            out[name] = {
                "sharding_type": ps.sharding_type,
                "compute_kernel": ps.compute_kernel,
                "ranks": [int(r) for r in ps.ranks or []],
                "shards": [
                    [int(s.placement.rank()), list(s.shard_offsets), list(s.shard_sizes)]
                    for s in shards
                ],
            }
    return out


def _fused(table: dict[str, Any], kind: str) -> bool:
    return table["sharding_type"] == kind and table["compute_kernel"] == DREAMSHARD_COMPUTE_KERNEL


def layout_entries(tables: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``placement`` (table-wise tables: their rank), ``shards`` (column-wise tables) and
    ``sharding`` (every other table: type, kernel, ranks); the last two only where not empty."""
    placement, shards, other = {}, {}, {}
    for name, t in tables.items():
        if _fused(t, DREAMSHARD_SHARDING_TYPE):
            placement[name] = t["ranks"][0]
        elif _fused(t, SPLIT_SHARDING_TYPE):
            cols = sorted((off[1], off[1] + size[1], rank) for rank, off, size in t["shards"])
            shards[name] = [{"device": r, "columns": [a, b]} for a, b, r in cols]
        else:
            other[name] = {k: t[k] for k in ("sharding_type", "compute_kernel", "ranks")}
    out: dict[str, Any] = {"placement": placement}
    if shards:
        out["shards"] = shards
    if other:
        out["sharding"] = other
    return out


def rank_tables(tables: dict[str, dict[str, Any]], world_size: int) -> list[list[str]]:
    """Each rank's tables, a shard as ``t0@0:64`` (columns) or ``t0@rows0:500`` (rows)."""
    out: list[list[str]] = [[] for _ in range(world_size)]
    for name, t in tables.items():
        if not t["shards"]:  # data-parallel: every rank holds it whole
            for rank in t["ranks"] or range(world_size):
                out[rank].append(name)
            continue
        shards = t["shards"]
        by_columns = all(off[0] == 0 for _, off, _ in shards)
        by_rows = all(off[1] == 0 for _, off, _ in shards)
        for rank, off, size in shards:
            rows = f"rows{off[0]}:{off[0] + size[0]}"
            cols = f"{off[1]}:{off[1] + size[1]}"
            if len(shards) == 1:
                out[rank].append(name)
            else:
                part = cols if by_columns else rows if by_rows else f"{rows},{cols}"
                out[rank].append(f"{name}@{part}")
    return out


def check_finite(prediction: PlanPrediction, per_rank: Sequence[Sequence[str]]) -> None:
    """Refuse a prediction holding NaN or infinity.

    Raises:
        ValueError: naming the tables of the ranks it is not finite on.
    """
    figures = [prediction.step_ms, *prediction.fwd_ms, *prediction.bwd_ms, *prediction.comm_ms]
    if all(math.isfinite(float(x)) for x in [*figures, *prediction.other_ms]):
        return
    culprits = [
        name
        for r, names in enumerate(per_rank)
        if not math.isfinite(float(prediction.total_ms(r)))
        for name in names
    ]
    raise ValueError(
        f"the cost network's prediction is not finite (NaN or infinity) for tables "
        f"{culprits[:20]}{' ...' if len(culprits) > 20 else ''}: their figures are outside "
        "what the checkpoint was trained on"
    )


def plan_summary(
    plan: ShardingPlan,
    options: Sequence[ShardingOption],
    prediction: PlanPrediction,
    memory: Sequence[int],
    tier: str = "ddr",
) -> dict[str, Any]:
    """The summary of ``plan``: its layout, predicted step (ms) and per device its tables,
    bytes on ``tier`` against ``memory`` and predicted ms.

    Raises:
        ValueError: the prediction is not finite (naming the tables).
    """
    tables = table_layout(plan)
    world = len(memory)
    per_rank = rank_tables(tables, world)
    check_finite(prediction, per_rank)
    used = rank_bytes(options, world, tier)
    per_device = [
        {
            "device": r,
            "tables": per_rank[r],
            "bytes": used[r],
            "memory_bytes": int(memory[r]),
            "fwd_ms": prediction.fwd_ms[r],
            "bwd_ms": prediction.bwd_ms[r],
            "comm_ms": prediction.comm_ms[r],
            "other_ms": prediction.other_ms[r],
            "total_ms": prediction.total_ms(r),
        }
        for r in range(world)
    ]
    return {
        **layout_entries(tables),
        "predicted_cost_ms": float(prediction.step_ms),
        "per_device": per_device,
    }
