"""Planning with calibration and verification (:func:`plan_task`), and what it made."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchrec_dreamshard.calibration.adaptation_report import calibration_summary, plan_margins
from torchrec_dreamshard.calibration.auto import VerificationSettings
from torchrec_dreamshard.calibration.fine_tuning import (
    CalibrationConfig,
    CalibrationResult,
    calibrate,
)
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure.spent import spent_on
from torchrec_dreamshard.policy.protocol import PlaceSettings
from torchrec_dreamshard.policy.split_search import fitting_task
from torchrec_dreamshard.verification.verification import verify
from torchrec_dreamshard.verification.verify_result import VerifyResult, plan_words

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy import DreamShard
    from torchrec_dreamshard.policy.split_search import SplitPlan


@dataclass
class PlanOutcome:
    """A plan made by :func:`plan_task`.

    Attributes:
        placement: device per table (per shard where the plan splits tables).
        agent: the agent that planned (the calibrated one, or the prior).
        calibration: what calibration did (``None`` without it).
        verification: the measured candidates (``None`` without verification).
        chosen: the agent's placement before verification.
        split: the split search's plan (``None`` without ``splits``).
        predicted_margins: where nothing was measured, the kept plan's predicted margins.
        chosen_label: the safety-net candidate the agent chose.
    """

    placement: list[int]
    agent: DreamShard
    calibration: CalibrationResult | None = None
    verification: VerifyResult | None = None
    chosen: list[int] = dataclasses.field(default_factory=list)
    split: SplitPlan | None = None
    predicted_margins: dict[str, Any] = dataclasses.field(default_factory=dict)
    chosen_label: str | None = None

    @property
    def margins(self) -> dict[str, Any]:
        """The kept plan against TorchRec's and the best heuristic's, with a ``line``:
        measured where verified, else predicted."""
        ver = self.verification
        if ver is None:
            return self.predicted_margins
        line = ver.summary(lambda n: plan_words(n, self.chosen_label))
        if self.predicted_margins:  # verified, but no whole round fitted: what was predicted
            line += "; " + self.predicted_margins["line"]
        return ver.margins() | {"line": line}

    def lines(self) -> list[str]:
        out = self.calibration.lines() if self.calibration else []
        return out + (self.verification.lines() if self.verification else [])

    def summary(self) -> list[str]:
        """What calibration and verification took and bought, a line each."""
        out = []
        cal = self.calibration
        if cal is not None:
            out.append(calibration_summary(cal.to_dict() | {"note": cal.note}))
        if self.margins:
            out.append(self.margins["line"])
        return out


def plan_task(
    agent: DreamShard,
    task: Task,
    *,
    how: PlaceSettings | None = None,
    calibration: CalibrationConfig | None = None,
    verification: VerificationSettings | None = None,
    calibrated: CalibrationResult | None = None,
    progress: bool = False,
    splits: bool = False,
) -> PlanOutcome:
    """Calibrate (given ``calibration``), place, and verify (given ``verification.k``).

    Args:
        agent: the prior agent (unchanged).
        how: mode, samples, seed and sources of ``DreamShard.place`` (``None``: defaults).
        calibrated: a calibration of ``agent`` already made, instead of calibrating again.
        splits: column-wise splits allowed (a plan that splits tables is not verified).
    """
    how = how if how is not None else PlaceSettings()
    sources = how.sources
    given = sources if sources is not None else agent.sources
    cal = calibrated
    if cal is None and calibration is not None:
        # with splits, calibrate on the shards the plan places (oversized tables cut)
        cal = calibrate(agent, fitting_task(task) if splits else task, calibration, sources)
    planner = cal.agent if cal is not None else agent
    found = None
    if splits:
        from torchrec_dreamshard.policy.split_search import plan_with_splits

        found = plan_with_splits(planner, task, how)
        if found.sharded.columns:
            return PlanOutcome(found.placement, planner, cal, None, found.placement, found)
        placement = list(found.placement)  # whole tables, in the task's order
    else:
        placement = planner.place(task, **how.kwargs())
    report = planner.last_report
    mode = how.mode or "safe"
    label = report.winner.label if report is not None and report.candidates else mode
    default_measure = calibration.measure if calibration is not None else None
    verified = verify_chosen(
        planner, task, placement, label, given, verification, default_measure, progress
    )
    return PlanOutcome(
        verified.placement,
        planner,
        cal,
        verified.verification,
        placement,
        found,
        verified.predicted_margins,
        label,
    )


def verify_chosen(
    agent: DreamShard,
    task: Task,
    chosen: list[int],
    label: str | None,
    sources: Sequence[Any],
    verification: VerificationSettings | None,
    measure: Any = None,
    progress: bool = False,
) -> PlanOutcome:
    """Verify ``chosen`` (candidate ``label``) beside the baselines of ``sources`` and the
    heuristics, and keep what :func:`~.verification.verify` picks (unmeasured: the
    predicted margins). ``measure``: settings where ``verification`` has none."""
    ver, placement = None, list(chosen)
    baselines = baseline_plans(task, sources)
    if verification is not None and verification.k:
        mcfg = verification.config or measure
        options = dataclasses.replace(verification.options, progress=progress)
        with spent_on("verification"):
            ver = verify(
                agent,
                task,
                verification.k,
                mcfg,
                options,
                extra={"chosen": list(chosen)},
                baselines=baselines,
            )
        placement = list(ver.winner.placement)
    unmeasured = ver is None or not any(p.rounds_ms for p in ver.plans)
    margins = plan_margins(agent, task, placement, baselines, label) if unmeasured else {}
    return PlanOutcome(placement, agent, None, ver, list(chosen), None, margins, label)


def baseline_plans(task: Task, sources: Sequence[Any]) -> dict[str, list[int]]:
    """The plans of the ``sources`` marked ``baseline``, by name (those with none left out)."""
    from torchrec_dreamshard.data.tasks import NoPlanError

    out = {}
    for source in sources:
        if not getattr(source, "baseline", False):
            continue
        try:
            plan = source.propose(task)
        except (NoPlanError, ValueError):  # none found, or none that fits ``task``
            continue
        if plan is not None:
            out[source.name] = [int(d) for d in plan]
    return out
