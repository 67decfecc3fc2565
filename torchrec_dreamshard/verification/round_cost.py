"""What a round of a verification costs in device timings, and the plans a slow task
measures (:func:`too_slow_for_all`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.device_sets import device_sets, distinct_device_sets
from torchrec_dreamshard.verification.plan_ranking import MIN_ROUNDS_TO_REPLACE, measuring_priority
from torchrec_dreamshard.verification.verify_result import VerifiedPlan

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy import PlacementAgent

MIN_ROUNDS = 3  # rounds a pass may stretch its budget for (a sign test needs 3)
BUDGET_STRETCH = 3.0  # ... up to this many times the budget
FIT_HEADROOM = 0.8  # a slow task measures the plans whose rounds fill this much of it
MIN_PLANS = 3  # ... and at least these: the planner's choice, TorchRec's, a heuristic's
# the fewest measurements a plan's verification starts: every plan in the rounds one must win
MIN_MEASUREMENTS = MIN_PLANS * MIN_ROUNDS_TO_REPLACE
MIN_VERIFY_S = 4.0  # fewer seconds of a plan's budget left than this: verification is skipped
HARD_SHARE = 0.9  # of the seconds left, a plan's verification spends at most this share


def measurement_seconds(
    agent: PlacementAgent, task: Task, placement: Sequence[int], scale: float = 1.0
) -> float:
    """Predicted seconds of one measurement of ``placement`` (an upper bound: each device's
    kernel in turn, ``warmup + iters`` forward and backward passes), ``agent``'s kernel
    costs times ``scale``."""
    if not placement:
        return 0.0
    config = MeasureConfig()
    cost = agent.predict(task, list(placement))
    per_pass = sum(cost.fwd_ms) + sum(cost.bwd_ms)
    return scale * (config.warmup + config.iters) * per_pass / 1000.0


def verification_seconds(one: float) -> float:
    """The fewest seconds of a plan's budget its verification starts in, where one
    measurement takes ``one`` second: :data:`MIN_MEASUREMENTS` of them within
    :data:`HARD_SHARE`, and never under :data:`MIN_VERIFY_S`."""
    return max(MIN_VERIFY_S, MIN_MEASUREMENTS * one / HARD_SHARE)


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
