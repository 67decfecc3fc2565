"""Planning with calibration and verification: :func:`plan_task` and the agent that
does it on every ``place`` (:class:`CalibratingAgent`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from torchrec_dreamshard.calibration.auto import (
    MachineCheck,
    check_machine,
    verification_settings,
)
from torchrec_dreamshard.calibration.fine_tuning import (
    CalibrationConfig,
    CalibrationResult,
    calibrate,
    stored_observations,
)
from torchrec_dreamshard.calibration.verification import VerifyResult, verify
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure.config import MeasureConfig

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy import (
        CandidateSource,
        CostPrediction,
        DreamShard,
        SafetyReport,
    )
    from torchrec_dreamshard.policy.split_search import SplitPlan


@dataclass
class PlanOutcome:
    """A plan made by :func:`plan_task`.

    Attributes:
        placement: device per table (per shard of ``split.sharded.shards`` where the plan
            splits tables).
        agent: the agent that planned (the calibrated one, or the prior).
        calibration: what calibration did (``None`` without it).
        verification: the measured candidates (``None`` without verification).
        chosen: the placement the agent chose, before verification (``placement``
            without it).
        split: the split search's plan (``None`` without ``splits``); where it cut
            tables column-wise, ``placement`` is per shard and nothing was verified.
    """

    placement: list[int]
    agent: DreamShard
    calibration: CalibrationResult | None = None
    verification: VerifyResult | None = None
    chosen: list[int] = dataclasses.field(default_factory=list)
    split: SplitPlan | None = None

    def lines(self) -> list[str]:
        out = self.calibration.lines() if self.calibration else []
        return out + (self.verification.lines() if self.verification else [])


def plan_task(
    agent: DreamShard,
    task: Task,
    *,
    mode: str = "safe",
    num_samples: int = 4,
    seed: int = 0,
    sources: Sequence[CandidateSource] | None = None,
    calibration: CalibrationConfig | None = None,
    verify_k: int = 0,
    verify_rounds: int = 3,
    verify_config: MeasureConfig | None = None,
    progress: bool = False,
    calibrated: CalibrationResult | None = None,
    verify_budget_s: float | None = None,
    verify_cache: bool = False,
    verify_incumbent: str | None = None,
    splits: bool = False,
) -> PlanOutcome:
    """Calibrate (when ``calibration`` is given), place, and verify (when ``verify_k``):
    the one path of the planner (:class:`CalibratingAgent`), ``dreamshard plan`` and the
    benchmarks.

    Args:
        agent: the prior agent (unchanged).
        task: the task.
        mode, num_samples, seed, sources: as ``DreamShard.place`` (``sources`` also choose
            the safe mode's candidates whose device groups calibration measures).
        calibration: calibration settings; ``None`` plans with ``agent`` as it is.
        verify_k: measure the ``verify_k`` best-rated candidates and the heuristics' plans
            and keep what :func:`~.verification.rank_measured` picks (0: no verification).
        verify_rounds: interleaved rounds of the verification.
        verify_config: its measurement settings (default: the calibration's, else
            :class:`MeasureConfig`'s).
        progress: tqdm bars.
        calibrated: a calibration of ``agent`` already made (on these tables or more) to
            plan with instead of calibrating again.
        verify_budget_s, verify_cache: bound and cache the verification (see
            :func:`~.verification.verify`).
        verify_incumbent: ``"chosen"``: the placement stands unless a measured plan beat
            it in every round (``None``: the fastest heuristic's plan stands unless ...).
        splits: place with column-wise splits allowed
            (:func:`~torchrec_dreamshard.policy.split_search.plan_with_splits`); a plan that
            splits tables is not verified (verification compares whole-table plans).
    """
    if verify_k < 0:
        raise ValueError(f"verify must be >= 0 candidate plans, got {verify_k}")
    cal = calibrated
    if cal is None and calibration is not None:
        cal = calibrate(agent, task, calibration, sources)
    planner = cal.agent if cal is not None else agent
    how = {"mode": mode, "num_samples": num_samples, "seed": seed, "sources": sources}
    found = None
    if splits:
        from torchrec_dreamshard.policy.split_search import plan_with_splits

        found = plan_with_splits(planner, task, **how)
        if found.sharded.columns:
            return PlanOutcome(found.placement, planner, cal, None, found.placement, found)
        placement = list(found.placement)  # whole tables, in the task's order
    else:
        placement = planner.place(task, **how)
    chosen, ver = placement, None
    if verify_k:
        mcfg = verify_config or (calibration.measure if calibration is not None else None)
        ver = verify(
            planner,
            task,
            verify_k,
            mcfg,
            verify_rounds,
            progress,
            {"chosen": placement},
            budget_s=verify_budget_s,
            cache=verify_cache,
            incumbent=verify_incumbent,
        )
        placement = list(ver.winner.placement)
    return PlanOutcome(placement, planner, cal, ver, chosen, found)


def adaptation_lines(adaptation: dict[str, Any]) -> list[str]:
    """How planning adapted to this machine (:meth:`CalibratingAgent.adaptation`): what
    was measured, whether it calibrated and verified, and the error before and after."""
    lines = [adaptation.get("why", "")]
    if adaptation.get("calibrated"):
        before, after = (adaptation.get(f"kernel_mape_{k}") for k in ("before", "after"))
        error = (
            f"kernel time error {before:.0f}% before, {after:.0f}% after"
            if before is not None and after is not None
            else "no kernel to fit (none stored, none measured)"
        )
        lines.append(
            f"calibrated in {adaptation.get('seconds', float('nan')):.1f} s: "
            f"{adaptation.get('kernels_measured', 0)} kernels measured, "
            f"{adaptation.get('kernels_reused', 0)} reused; {error}"
        )
    else:
        lines.append("planned with the checkpoint as it is (no calibration)")
    if adaptation.get("verified"):
        how = (
            "read from this machine's cache"
            if adaptation.get("verify_cached")
            else f"in {adaptation.get('verify_seconds', float('nan')):.1f} s"
        )
        lines.append(
            f"verified on real kernels: {adaptation.get('verify_plans', 0)} plans (the "
            f"heuristics' among them), {adaptation.get('verify_rounds', 0)} rounds, {how}; "
            f"kept: {adaptation.get('verify_chosen', '')}"
        )
    recalled = adaptation.get("inputs_from_job")
    if recalled:
        lines.append(
            f"{len(recalled)} tables planned as a running job of them fed them (pooling "
            "factors and reuse observed), not as declared"
        )
    return lines


class CalibratingAgent:
    """An agent (:class:`~torchrec_dreamshard.policy.PlacementAgent`) whose ``place``
    calibrates on the task's tables first and verifies the best candidates after
    (:func:`plan_task`); ``predict`` and the other members use the calibrated agent once
    there is one (the prior before).

    Args:
        agent: the prior agent.
        calibration: calibration settings (``None``: verification only).
        verify_k: candidates to verify by measuring (0: none; ``None``: automatic, i.e.
            :data:`~.auto.AUTO_VERIFY_K` within :data:`~.auto.AUTO_VERIFY_S`, cached, where
            the automatic check calibrates, and none elsewhere).
        verify_rounds: interleaved rounds of the verification.
        progress: tqdm bars.
        auto: calibrate only where the checkpoint misprices this machine: ``auto()``
            gives this machine's reference kernel ``(fwd, bwd)`` ms (or ``None``), and
            :func:`~.auto.check_machine` decides, once, at the first ``prepare`` or
            ``place`` (``None``: calibrate whenever ``calibration`` is given).
    """

    def __init__(
        self,
        agent: DreamShard,
        calibration: CalibrationConfig | None,
        verify_k: int | None = 0,
        verify_rounds: int = 3,
        progress: bool = True,
        auto: Callable[[], tuple[float, float] | None] | None = None,
    ) -> None:
        self.prior = agent
        self.current = agent
        self.calibration = calibration
        self.verify_k, self.verify_rounds, self.progress = verify_k, verify_rounds, progress
        self.last_outcome: PlanOutcome | None = None
        self.last_calibration: CalibrationResult | None = None
        self.last_verification: VerifyResult | None = None
        self.check: MachineCheck | None = None
        self.learns_from_job = False  # calibrated on a running job's observations only
        self._auto = auto
        self._prepared: CalibrationResult | None = None

    @property
    def calibration_enabled(self) -> bool:
        """Whether ``place`` calibrates on this machine (under ``auto``, what the machine
        check decided; the check runs on first use)."""
        if self.calibration is None:
            return False
        if self._auto is None:
            return True
        if self.check is None:
            self.check = check_machine(self.prior, self._auto())
        return self.check.mispriced

    def _verification(self) -> tuple[int, float | None, bool, str | None]:
        """``(k, budget_s, cache, incumbent)`` of the verification ``place`` runs: as given
        (the fastest heuristic's plan stands unless another beat it every round), or, where
        it is automatic, :func:`~.auto.verification_settings` on a machine the checkpoint
        misprices, and none where the checkpoint prices it right."""
        if self.verify_k is not None:
            return verification_settings(self.verify_k, auto_calibrates=False)
        auto_calibrates = self._auto is not None and self.calibration_enabled
        return verification_settings(None, auto_calibrates)

    def _settings(self, task: Task) -> CalibrationConfig | None:
        """How ``place`` / ``prepare`` calibrate on ``task``: as configured where the
        machine check (or the user) asks for it; else, under ``auto``, on what the store
        holds (measuring nothing) where it holds kernels observed in a running job of
        these tables (:meth:`~torchrec_dreamshard.planner.DreamShardPlanner.observe`);
        else not at all."""
        if self.calibration is None:
            return None
        if self.calibration_enabled:
            return self.calibration
        if self._auto is not None and stored_observations(self.calibration, task):
            self.learns_from_job = True
            return dataclasses.replace(self.calibration, measure_missing=False)
        return None

    def adaptation(self) -> dict[str, Any]:
        """How planning adapted to this machine: whether it calibrated, why, and the
        cost network's error before and after (JSON-able; logged with the plan)."""
        out: dict[str, Any] = {"mode": "auto" if self._auto is not None else "on"}
        if self.calibration is None:
            return {"mode": "off", "calibrated": False, "why": "verification only"}
        if self._auto is not None and self.check is not None:
            out.update(self.check.to_dict(), why=self.check.why())
            if self.learns_from_job:
                out["why"] += "; learning from the kernels observed in a running job"
        elif self._auto is None:
            out["why"] = "calibrate was asked for"
        cal = self.last_calibration
        out["calibrated"] = cal is not None
        if cal is not None:
            out.update(
                seconds=cal.seconds,
                kernels_measured=cal.measured,
                kernels_reused=cal.reused,
                kernel_mape_before=cal.before.get("cost/mape"),
                kernel_mape_after=cal.after.get("cost/mape"),
            )
            reference = check_machine(cal.agent, self.check.measured_ms) if self.check else None
            if reference is not None:
                out["reference_error_after"] = reference.error
        ver = self.last_verification
        out["verified"] = ver is not None
        if ver is not None:
            out.update(
                verify_plans=len(ver.plans),
                verify_rounds=len(ver.winner.rounds_ms),
                verify_seconds=ver.seconds,
                verify_cached=ver.cached,
                verify_chosen=ver.winner.name,
            )
        return out

    def prepare(self, task: Task, sources: Sequence[CandidateSource] | None = None) -> None:
        """Calibrate the prior on ``task``'s tables now (when calibration is on): ``predict``
        and ``table_costs`` then price with the calibrated agent, and the next ``place``
        (of these tables or some of them) plans with it instead of calibrating again."""
        settings = self._settings(task)
        if settings is None:
            return
        self._prepared = calibrate(self.prior, task, settings, sources)
        self.current = self._prepared.agent
        self.last_calibration = self._prepared

    def place(
        self,
        task: Task,
        mode: str = "safe",
        num_samples: int = 4,
        seed: int = 0,
        sources: Sequence[CandidateSource] | None = None,
    ) -> list[int]:
        """Calibrate the prior on ``task`` (unless :meth:`prepare` just did), place with the
        calibrated agent and verify (:func:`plan_task`); the outcome is kept in
        :attr:`last_outcome` and logged."""
        verify_k, verify_budget_s, verify_cache, verify_incumbent = self._verification()
        out = plan_task(
            self.prior,
            task,
            mode=mode,
            num_samples=num_samples,
            seed=seed,
            sources=sources,
            calibration=self._settings(task),
            verify_k=verify_k,
            verify_rounds=self.verify_rounds,
            progress=self.progress,
            calibrated=self._prepared,
            verify_budget_s=verify_budget_s,
            verify_cache=verify_cache,
            verify_incumbent=verify_incumbent,
        )
        self._prepared = None  # one preparation serves one placement
        self.current, self.last_outcome = out.agent, out
        self.last_calibration = out.calibration or self.last_calibration
        self.last_verification = out.verification or self.last_verification
        log = logging.getLogger("torchrec_dreamshard.calibration")
        for line in out.lines():
            log.info(line)
        return out.placement

    def fingerprint(self) -> str:
        """The prior's fingerprint and the calibration and verification settings (the
        calibrated weights follow from them on a given machine)."""
        settings = [self.calibration, self.verify_k, self.verify_rounds, self._auto is not None]
        return hashlib.sha256(f"{self.prior.fingerprint()}|{settings!r}".encode()).hexdigest()

    @property
    def without_measuring(self) -> DreamShard:
        """The agent that places without measuring: the calibrated agent once ``place``
        has calibrated (the prior before). The split search re-places shards with it, so
        that trying a split does not calibrate and verify again."""
        return self.current

    @property
    def meta(self) -> dict[str, Any]:
        """The current agent's metadata (the calibrated agent's records the calibration)."""
        return self.current.meta

    @property
    def last_report(self) -> SafetyReport | None:
        """The current agent's safety-net report of its last placement."""
        return self.current.last_report

    @last_report.setter
    def last_report(self, report: SafetyReport | None) -> None:
        self.current.last_report = report

    def predict(self, task: Task, placement: Sequence[int]) -> CostPrediction:
        """The current agent's prediction."""
        return self.current.predict(task, placement)

    def table_costs(self, task: Task) -> np.ndarray:
        """The current agent's single-table costs."""
        return self.current.table_costs(task)
