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
from torchrec_dreamshard.calibration.verification import VerifyOptions, heuristic_plans, verify
from torchrec_dreamshard.calibration.verify_result import (
    TORCHREC_WORDS,
    VerifyResult,
    percent,
    plan_words,
)
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.policy.split_search import fitting_task

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
        predicted_margins: where nothing was verified, the kept plan's predicted step
            against TorchRec's plan's and the best heuristic's (:func:`plan_margins`;
            empty for a plan that splits tables). See :attr:`margins`.
        chosen_label: the safety-net candidate the agent chose (``policy_greedy+refined``).
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
        """The kept plan against TorchRec's plan and the best heuristic's, with a ``line``
        for people: measured where verified, else :attr:`predicted_margins`."""
        ver = self.verification
        if ver is None:
            return self.predicted_margins
        return ver.margins() | {"line": ver.summary(lambda n: plan_words(n, self.chosen_label))}

    def lines(self) -> list[str]:
        out = self.calibration.lines() if self.calibration else []
        return out + (self.verification.lines() if self.verification else [])

    def summary(self) -> list[str]:
        """What measuring took and bought, one line per step: how long calibration took
        and how far it moved the model's kernel error; how long verification took, which
        plan it kept and by how much it measured faster than TorchRec's plan and the best
        heuristic's (where nothing was measured, the predicted margins)."""
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
    given = sources if sources is not None else getattr(agent, "sources", ())
    cal = calibrated
    if cal is None and calibration is not None:
        # With splits, calibrate on the shards the plan places: a table bigger than every
        # device cut into the fewest column-wise shards that fit one (no plan of the
        # whole table's fused groups exists).
        cal = calibrate(agent, fitting_task(task) if splits else task, calibration, sources)
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
    report = planner.last_report
    label = report.winner.label if report is not None and report.candidates else mode
    chosen, ver = placement, None
    baselines = baseline_plans(task, given)
    if verify_k:
        mcfg = verify_config or (calibration.measure if calibration is not None else None)
        options = VerifyOptions(
            rounds=verify_rounds,
            budget_s=verify_budget_s,
            cache=verify_cache,
            incumbent=verify_incumbent,
            progress=progress,
        )
        ver = verify(
            planner,
            task,
            verify_k,
            mcfg,
            options,
            extra={"chosen": placement},
            baselines=baselines,
        )
        placement = list(ver.winner.placement)
    margins = {} if ver is not None else plan_margins(planner, task, placement, baselines, label)
    return PlanOutcome(placement, planner, cal, ver, chosen, found, margins, label)


def baseline_plans(task: Task, sources: Sequence[Any]) -> dict[str, list[int]]:
    """The plans of the candidate ``sources`` that are baselines (a true ``baseline``
    attribute: TorchRec's own planner, handed in from the planner side), by name; a
    source that offers none for ``task`` or finds none is left out."""
    from torchrec_dreamshard.data.tasks import NoPlanError

    out = {}
    for source in sources:
        if not getattr(source, "baseline", False):
            continue
        try:
            plan = source.propose(task)
        except NoPlanError:
            continue
        if plan is not None:
            out[source.name] = [int(d) for d in plan]
    return out


def plan_margins(
    agent: Any,
    task: Task,
    placement: Sequence[int],
    baselines: dict[str, list[int]],
    label: str | None = None,
) -> dict[str, Any]:
    """Where nothing was measured: the kept ``placement``'s predicted step over TorchRec's
    plan's (the first of ``baselines``) and over the best heuristic's (the lowest
    predicted), and one line saying so."""
    kept = agent.predict(task, placement).step_ms
    torchrec = next(iter(baselines.values()), None)
    vs_torchrec = kept / agent.predict(task, torchrec).step_ms if torchrec else None
    heuristics = [agent.predict(task, list(p)).step_ms for p in heuristic_plans(task).values()]
    vs_best = kept / min(heuristics) if heuristics else None
    same = torchrec is not None and list(placement) == list(torchrec)
    line = "kept " + plan_words("chosen", label) + (", the same as TorchRec's" if same else "")
    parts = []
    if vs_torchrec is not None and not same:
        parts.append(f"{percent(vs_torchrec)} TorchRec's")
    elif torchrec is None:
        line += f" ({TORCHREC_WORDS} was not planned here)"
    if vs_best is not None:
        parts.append(f"{percent(vs_best)} the best heuristic's")
    if parts:
        line += ", predicted " + " and ".join(parts) + " (not measured)"
    return {
        "kept": "chosen",
        "vs_torchrec": vs_torchrec,
        "vs_best_heuristic": vs_best,
        "measured": False,
        "line": line,
    }


def calibration_summary(calibration: dict[str, Any]) -> str:
    """One line of what calibration took and changed, from its ``to_dict`` (or the
    adaptation's keys): ``calibrated in 18.2 s: 40 kernels measured, 3 reused; kernel
    time error 36% before, 4% after``, and why kernels were discarded, if they were."""
    before = calibration.get("kernel_mape_before", calibration.get("before", {}))
    after = calibration.get("kernel_mape_after", calibration.get("after", {}))
    before = before.get("cost/mape") if isinstance(before, dict) else before
    after = after.get("cost/mape") if isinstance(after, dict) else after
    error = (
        f"kernel time error {before:.0f}% before, {after:.0f}% after"
        if before is not None and after is not None
        else "no kernel to fit (none stored, none measured)"
    )
    measured = calibration.get("kernels_measured", calibration.get("measured", 0))
    reused = calibration.get("kernels_reused", calibration.get("reused", 0))
    line = (
        f"calibrated in {calibration.get('seconds', float('nan')):.1f} s: {measured} kernels "
        f"measured, {reused} reused; {error}"
    )
    note = calibration.get("note") or calibration.get("calibration_note")
    return f"{line}; {note}" if note else line


def adaptation_lines(adaptation: dict[str, Any]) -> list[str]:
    """How planning adapted to this machine (:meth:`CalibratingAgent.adaptation`): what
    was measured, whether it calibrated and verified, what each took and what it bought
    (the kept plan against TorchRec's and the best heuristic's)."""
    lines = [adaptation.get("why", "")]
    if adaptation.get("calibrated"):
        lines.append(calibration_summary(adaptation))
    else:
        lines.append("planned with the checkpoint as it is (no calibration)")
    margins = adaptation.get("margins") or {}
    if margins.get("line"):
        lines.append(margins["line"])
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
            out.update(mode="off", why="verification only")
        elif self._auto is not None and self.check is not None:
            out.update(self.check.to_dict(), why=self.check.why())
            if self.learns_from_job:
                out["why"] += "; learning from the kernels observed in a running job"
        else:
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
                calibration_drift=cal.drift,
                kernels_discarded=cal.discarded,
                calibration_note=cal.note,
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
                verify_noise=[n.to_dict() for n in ver.passes],
                verify_fallback=ver.fallback,
            )
        if self.last_outcome is not None and self.last_outcome.margins:
            out["margins"] = self.last_outcome.margins
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
    def placer(self) -> DreamShard:
        """The agent that places without measuring: the calibrated agent once ``place``
        has calibrated (the prior before). The split search re-places shards with it, so
        that trying a split does not calibrate and verify again."""
        return self.current

    @property
    def meta(self) -> dict[str, Any]:
        """The current agent's metadata (the calibrated agent's records the calibration,
        here with its kernel MAPE after fitting: the error the type choice's margin takes
        for the calibrated kernels)."""
        meta = self.current.meta
        cal = self.last_calibration
        if cal is None or cal.agent is not self.current or "calibrated" not in meta:
            return meta
        mape = cal.after.get("cost/mape")
        return {**meta, "calibrated": {**meta["calibrated"], "kernel_mape": mape}}

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
