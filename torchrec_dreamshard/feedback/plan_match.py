"""Whether a job runs the plan its observer observes, compared table by table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec.distributed.types import ShardingPlan


def plan_layout_key(plan: ShardingPlan) -> dict[str, tuple]:
    """Each table's ``(sharding type, kernel, ranks, shards)`` in ``plan``, by fqn."""
    out: dict[str, tuple] = {}
    for path, module_plan in plan.plan.items():
        for name, sharding in module_plan.items():
            spec = sharding.sharding_spec
            shards = tuple(
                (tuple(m.shard_offsets), tuple(m.shard_sizes), str(m.placement))
                for m in (spec.shards if spec is not None and hasattr(spec, "shards") else ())
            )
            ranks = tuple(sharding.ranks or ())
            out[f"{path}.{name}"] = (sharding.sharding_type, sharding.compute_kernel, ranks, shards)
    return out


def check_observed_plan(plan: ShardingPlan, dmp: Any, what: str = "observe(planner, dmp)") -> None:
    """Raise where ``dmp.plan`` differs from ``plan``, the one observed.

    Raises:
        ValueError: naming the tables whose sharding differs, and what to do.
    """
    built = getattr(dmp, "plan", None)
    if built is None or built is plan:
        return
    ours, theirs = plan_layout_key(plan), plan_layout_key(built)
    differ = sorted(n for n in ours.keys() | theirs.keys() if ours.get(n) != theirs.get(n))
    if not differ:
        return
    shown = differ[:5] + ([f"... ({len(differ)} tables)"] if len(differ) > 5 else [])
    raise ValueError(
        f"{what}: the DMP was built from another plan than the one observed (tables "
        f"{shown} are sharded otherwise), so its report would compare it with the wrong "
        "prediction; observe the planner that made the DMP's plan (observe(planner, dmp) "
        "after that planner's collective_plan), or, for a job restarted with "
        "observer.replan()'s plan, call observer.follow(dmp, new_plan) on the observer "
        "that replanned"
    )
