"""The verification step of :meth:`DreamShardPlanner.plan`, after TorchRec's loop: the only
other step that measures.

Where the agent verifies (:meth:`CalibratingAgent.verification`: automatically where the
profile calibrated, or ``verify=k`` asked for), the placement the policy chose in the loop
is measured on real kernels beside the heuristics' plans and TorchRec's own plan, in
interleaved rounds, within what is left of the plan's budget
(:func:`~torchrec_dreamshard.calibration.planning.verify_chosen`). Where it keeps another
plan, the agent is pinned to it and TorchRec's loop runs once more, measuring nothing, so
that the plan TorchRec returns is built, rated and logged by TorchRec's own machinery.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any

from torchrec_dreamshard.calibration.planning import verify_chosen
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.planner.steps.adaptation import calibrating
from torchrec_dreamshard.policy.protocol import PlacementAgent
from torchrec_dreamshard.profile.budget import Budget
from torchrec_dreamshard.verification.plan_ranking import MIN_ROUNDS_TO_REPLACE
from torchrec_dreamshard.verification.verification import MIN_PLANS

logger = logging.getLogger("torchrec_dreamshard.planner")

MIN_VERIFY_S = 4.0  # fewer seconds left than this: verification is skipped
NOISY_SHARE = 0.5  # of the seconds left, for the first pass (a noisy one gets as much again)
HARD_SHARE = 0.9  # of the seconds left, the hard cap over both passes (the loop runs after)
# the fewest measurements worth starting: the planner's choice, TorchRec's plan and a
# heuristic's, in the two rounds a plan must win to replace the choice
MIN_MEASUREMENTS = MIN_PLANS * MIN_ROUNDS_TO_REPLACE


def measurement_seconds(agent: PlacementAgent, task: Task, placement: Sequence[int]) -> float:
    """Predicted seconds of one measurement of ``placement``: the local backend times each
    device's fused kernel in turn, ``warmup + iters`` iterations of its forward and
    backward (:class:`~torchrec_dreamshard.measure.config.MeasureConfig`'s defaults).
    An upper bound of what the verification pays for each plan of a round: a device
    table-set that plans share is timed once per round
    (:mod:`~torchrec_dreamshard.measure.device_sets`), and the verification's own budget
    counts that in from its first measurement (:mod:`~torchrec_dreamshard.verification.
    round_cost`)."""
    if not placement:
        return 0.0
    config = MeasureConfig()
    cost = agent.predict(task, list(placement))
    per_pass = sum(cost.fwd_ms) + sum(cost.bwd_ms)
    return (config.warmup + config.iters) * per_pass / 1000.0


def verify_after_loop(
    agent: PlacementAgent,
    budget: Budget,
    sources: Sequence[Any],
    ours_won: bool,
    notes: list[str],
) -> bool:
    """Verify the placement of the frozen ``agent``'s last ``place``; ``True`` where
    another plan was kept and the agent is pinned to it (the caller plans again).
    ``ours_won``: DreamShard's proposal is the plan TorchRec kept (else nothing of ours
    is verified). What was skipped, and why, is appended to ``notes``."""
    wrapper = calibrating(agent)
    if wrapper is None or not wrapper.frozen or wrapper.last_task is None:
        return False
    settings = wrapper.verification()
    if not settings.k:
        return False
    if not ours_won:
        notes.append("verification skipped: a user's proposal won TorchRec's loop")
        return False
    left = budget.remaining()
    if left < MIN_VERIFY_S:
        notes.append(
            f"verification skipped: {left:.1f} s of the plan's budget left "
            f"(it needs {MIN_VERIFY_S:.0f} s); the plan is the policy's, unmeasured"
        )
        return False
    one = measurement_seconds(wrapper.current, wrapper.last_task, wrapper.last_chosen or [])
    if math.isfinite(left) and MIN_MEASUREMENTS * one > left * HARD_SHARE:
        notes.append(
            f"verification skipped: one measurement of a plan of this task takes about "
            f"{one:.1f} s (predicted), and {MIN_MEASUREMENTS} of them do not fit the "
            f"{left:.1f} s left of the plan's budget; the plan is the policy's, unmeasured"
        )
        return False
    if math.isfinite(left):
        cap = settings.options.budget_s
        share = left * NOISY_SHARE if cap is None else min(cap, left * NOISY_SHARE)
        options = dataclasses.replace(
            settings.options, budget_s=share, deadline_s=left * HARD_SHARE
        )
        if cap is None or share < cap:
            notes.append(
                f"verification given {share:.0f} s (at most {left * HARD_SHARE:.0f} s with a "
                "noisy second pass) of the plan's budget: plans that do not fit are not measured"
            )
        settings = dataclasses.replace(settings, options=options)
    measure = wrapper.calibration.measure if wrapper.calibration is not None else None
    chosen = list(wrapper.last_chosen or [])
    outcome = verify_chosen(
        wrapper.current,
        wrapper.last_task,
        chosen,
        wrapper.last_label,
        sources,
        settings,
        measure,
        wrapper.progress,
    )
    wrapper.record_verification(outcome)
    for line in outcome.lines():
        logger.info(line)
    if outcome.placement == chosen:
        return False
    wrapper.pin(wrapper.last_task, outcome.placement)
    return True
