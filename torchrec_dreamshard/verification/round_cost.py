"""What a round of a verification costs in device timings, and the plans a slow task
measures (:func:`too_slow_for_all`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure.device_sets import device_sets, distinct_device_sets
from torchrec_dreamshard.verification.plan_ranking import measuring_priority
from torchrec_dreamshard.verification.verify_result import VerifiedPlan

MIN_ROUNDS = 3  # rounds a pass may stretch its budget for (a sign test needs 3)
BUDGET_STRETCH = 3.0  # ... up to this many times the budget
FIT_HEADROOM = 0.8  # a slow task measures the plans whose rounds fill this much of it
MIN_PLANS = 3  # ... and at least these: the planner's choice, TorchRec's, a heuristic's


def round_units(task: Task, plans: Sequence[VerifiedPlan], sharing: bool) -> int:
    """Device timings one round of ``plans`` takes (with ``sharing``: distinct device sets)."""
    if not sharing:
        return len(plans)
    return distinct_device_sets(task, [p.placement for p in plans])


def unit_seconds(task: Task, first: VerifiedPlan, seconds: float, sharing: bool) -> float:
    """Seconds of one :func:`round_units` unit, where measuring ``first`` took ``seconds``."""
    if not sharing:
        return seconds
    return seconds / max(1, len(device_sets(task, first.placement)))


def first_rounds_seconds(
    task: Task, plans: Sequence[VerifiedPlan], rounds: int, unit_s: float, sharing: bool
) -> float:
    """Predicted seconds of the first ``min(MIN_ROUNDS, rounds)`` rounds of ``plans``."""
    return min(MIN_ROUNDS, rounds) * round_units(task, plans, sharing) * unit_s


def too_slow_for_all(
    task: Task,
    plans: Sequence[VerifiedPlan],
    options: tuple[float | None, int, str | None],
    unit_s: float,
    sharing: bool,
) -> list[VerifiedPlan]:
    """The plans whose first :data:`MIN_ROUNDS` rounds fit :data:`BUDGET_STRETCH` times the
    budget, at least :data:`MIN_PLANS`, in :func:`~.plan_ranking.measuring_priority` order.

    Args:
        options: the verification's ``(budget_s, rounds, incumbent)``.
        unit_s: seconds of one device timing.
    """
    budget_s, rounds, incumbent = options
    budget = (budget_s or math.inf) * BUDGET_STRETCH * FIT_HEADROOM
    fit = budget // (min(MIN_ROUNDS, rounds) * unit_s)
    chosen: list[int] = []
    for i in measuring_priority(plans, incumbent):
        more = round_units(task, [plans[j] for j in [*chosen, i]], sharing)
        if len(chosen) >= MIN_PLANS and more > fit:
            break
        chosen.append(i)
    keep = set(chosen)
    return [p for i, p in enumerate(plans) if i in keep]
