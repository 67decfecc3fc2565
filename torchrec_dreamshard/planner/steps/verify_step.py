"""The verification step of ``DreamShardPlanner.plan``: the loop's choice measured beside
the baselines within what is left of the budget, and the :class:`Verdict` on it."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torchrec.distributed.planner.types import ShardingOption, Topology

from torchrec_dreamshard.calibration.adaptation_report import plan_margins, verification_record
from torchrec_dreamshard.calibration.auto import VerificationSettings
from torchrec_dreamshard.calibration.planning import PlanOutcome, baseline_plans, verify_chosen
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task, placed_bytes
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.planner.adapters.device_memory import (
    device_capacity,
    memory_tier,
    option_bytes,
    rank_bytes,
)
from torchrec_dreamshard.planner.stages.option_kinds import is_policy_option, is_split_option
from torchrec_dreamshard.planner.stages.partitioners import policy_caps
from torchrec_dreamshard.policy.protocol import PlacementAgent
from torchrec_dreamshard.policy.safety_net import SafetyReport
from torchrec_dreamshard.profile.budget import Budget
from torchrec_dreamshard.verification.round_cost import (
    HARD_SHARE,
    MIN_MEASUREMENTS,
    MIN_VERIFY_S,
    measurement_seconds,
)
from torchrec_dreamshard.verification.verify_result import VerifyResult

logger = logging.getLogger("torchrec_dreamshard.planner")

NOISY_SHARE = 0.5  # of the seconds left, for the first pass (a noisy one gets as much again)


@dataclass(frozen=True)
class LoopChoice:
    """What TorchRec's loop chose for the tables the policy placed, as a value.

    Attributes:
        task: the policy's tables, on the memory they were placed in, at the global batch.
        placement: the device of each of ``task``'s tables.
        fqns: each table's fully qualified name, in ``task``'s order.
        label: the safety-net candidate the placement came from (``None``: unknown).
    """

    task: Task
    placement: tuple[int, ...]
    fqns: tuple[str, ...]
    label: str | None = None


@dataclass(frozen=True)
class Verdict:
    """What the verification measured and which placement the plan keeps.

    Attributes:
        outcome: what was measured (``None``: nothing was).
        notes: what was skipped and why.
        kept: each verified table's device, by fqn, where another plan than the loop's
            was kept (``None``: the loop's stands).
        choice: what was verified (``None``: nothing).
    """

    outcome: PlanOutcome | None = None
    notes: tuple[str, ...] = ()
    kept: dict[str, int] | None = None
    choice: LoopChoice | None = None

    @property
    def verification(self) -> VerifyResult | None:
        """What was measured (``None``: nothing)."""
        return self.outcome.verification if self.outcome is not None else None

    def record(self) -> dict[str, Any]:
        """The verification's part of the plan's adaptation record."""
        outcome = self.outcome
        ver = outcome.verification if outcome is not None else None
        out = verification_record(ver)
        if ver is not None and ver.failure is not None:
            out["measure_failures"] = [ver.failure.to_dict()]
        if outcome is not None and outcome.margins:
            out["margins"] = outcome.margins
        return out


def policy_choice(
    plan: Sequence[ShardingOption],
    constraint: Topology,
    spec: Callable[[ShardingOption], TableSpec],
    batch_size: int,
    report: SafetyReport | None = None,
) -> LoopChoice | None:
    """The tables the policy placed in ``plan``, on the memory the partitioner gave it (in
    weights), at the global ``batch_size``; ``None`` where it placed none or split one."""
    label = report.winner.label if report is not None and report.candidates else None
    if any(is_split_option(o) for o in plan):
        return None
    ours = [o for o in plan if is_policy_option(o)]
    if not ours:
        return None
    tier = memory_tier(constraint)
    others = [o for o in plan if not is_policy_option(o)]
    used = rank_bytes(others, constraint.world_size, tier)
    left = [cap - u for cap, u in zip(device_capacity(constraint), used, strict=True)]
    specs = [spec(o) for o in ours]
    placement = [int(o.shards[0].rank) for o in ours]
    caps = policy_caps(specs, [option_bytes(o, tier) for o in ours], [max(0, x) for x in left])
    # at least what each placement puts on a device: a share may have been raised
    sizes = [t.size_bytes for t in specs]
    placements = [placement, *(c.placement for c in (report.candidates if report else []))]
    memory = list(caps)
    for each in placements:
        if len(each) == len(specs):
            used = placed_bytes(sizes, [int(d) for d in each], len(caps))
            memory = [max(m, u) for m, u in zip(memory, used, strict=True)]
    task = Task(
        tables=specs,
        num_devices=len(memory),
        memory_bytes=memory,
        batch_size=batch_size,
        allow_oversized=True,
    )
    return LoopChoice(task, tuple(placement), tuple(o.fqn for o in ours), label)


def skipped(reason: str) -> Verdict:
    """A verdict of nothing measured, and why."""
    return Verdict(notes=(reason,))


def unmeasured(
    agent: PlacementAgent, choice: LoopChoice, sources: Sequence[Any], note: str | None = None
) -> Verdict:
    """A verdict of nothing measured, with the predicted margins the plan was kept on."""
    placement = list(choice.placement)
    baselines = baseline_plans(choice.task, sources)
    margins = plan_margins(agent, choice.task, placement, baselines, choice.label)
    outcome = PlanOutcome(
        placement, agent, chosen=placement, predicted_margins=margins, chosen_label=choice.label
    )
    return Verdict(outcome, (note,) if note else (), None, choice)


def verify_choice(
    agent: PlacementAgent,
    choice: LoopChoice,
    settings: VerificationSettings,
    budget: Budget,
    sources: Sequence[Any],
    measure: MeasureConfig | None,
) -> Verdict:
    """Measure ``choice`` against the baselines of ``sources`` and the heuristics within
    what is left of ``budget`` (``measure``: where ``settings`` names no measurement)."""
    left = budget.remaining()
    if left < MIN_VERIFY_S:
        return unmeasured(
            agent,
            choice,
            sources,
            f"verification skipped: {left:.1f} s of the plan's budget left "
            f"(it needs {MIN_VERIFY_S:.0f} s); the plan is the policy's, unmeasured",
        )
    one = measurement_seconds(agent, choice.task, choice.placement)
    if math.isfinite(left) and MIN_MEASUREMENTS * one > left * HARD_SHARE:
        return unmeasured(
            agent,
            choice,
            sources,
            f"verification skipped: one measurement of a plan of this task takes about "
            f"{one:.1f} s (predicted), and {MIN_MEASUREMENTS} of them do not fit the "
            f"{left:.1f} s left of the plan's budget; the plan is the policy's, unmeasured",
        )
    notes: list[str] = []
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
    chosen = list(choice.placement)
    outcome = verify_chosen(agent, choice.task, chosen, choice.label, sources, settings, measure)
    for line in outcome.lines():
        logger.info(line)
    kept = None
    if outcome.placement != chosen:
        kept = dict(zip(choice.fqns, outcome.placement, strict=True))
    return Verdict(outcome, tuple(notes), kept, choice)
