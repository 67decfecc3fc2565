"""Planning with calibration and verification: :func:`plan_task` and the agent that
does it on every ``place`` (:class:`CalibratingAgent`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from torchrec_dreamshard.calibration.fit import CalibrationConfig, CalibrationResult, calibrate
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


@dataclass
class PlanOutcome:
    """A plan made by :func:`plan_task`.

    Attributes:
        placement: device per table.
        agent: the agent that planned (the calibrated one, or the prior).
        calibration: what calibration did (``None`` without it).
        verification: the measured candidates (``None`` without verification).
    """

    placement: list[int]
    agent: DreamShard
    calibration: CalibrationResult | None = None
    verification: VerifyResult | None = None

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
) -> PlanOutcome:
    """Calibrate (when ``calibration`` is given), place, and verify (when ``verify_k``).

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
    """
    if verify_k < 0:
        raise ValueError(f"verify must be >= 0 candidate plans, got {verify_k}")
    cal = calibrated
    if cal is None and calibration is not None:
        cal = calibrate(agent, task, calibration, sources)
    planner = cal.agent if cal is not None else agent
    placement = planner.place(task, mode=mode, num_samples=num_samples, seed=seed, sources=sources)
    ver = None
    if verify_k:
        mcfg = verify_config or (calibration.measure if calibration is not None else None)
        ver = verify(
            planner, task, verify_k, mcfg, verify_rounds, seed, progress, {"chosen": placement}
        )
        placement = list(ver.winner.placement)
    return PlanOutcome(placement, planner, cal, ver)


class CalibratingAgent:
    """An agent (:class:`~torchrec_dreamshard.policy.PlacementAgent`) whose ``place``
    calibrates on the task's tables first and verifies the best candidates after
    (:func:`plan_task`); ``predict`` and the other members use the calibrated agent once
    there is one (the prior before).

    Args:
        agent: the prior agent.
        calibration: calibration settings (``None``: verification only).
        verify_k: candidates to verify by measuring (0: none).
        verify_rounds: interleaved rounds of the verification.
        progress: tqdm bars.
    """

    calibration_enabled: bool = True  # place measures on this machine

    def __init__(
        self,
        agent: DreamShard,
        calibration: CalibrationConfig | None,
        verify_k: int = 0,
        verify_rounds: int = 3,
        progress: bool = True,
    ) -> None:
        self.prior = agent
        self.current = agent
        self.calibration = calibration
        self.verify_k, self.verify_rounds, self.progress = verify_k, verify_rounds, progress
        self.last_outcome: PlanOutcome | None = None
        self._prepared: CalibrationResult | None = None

    def prepare(self, task: Task, sources: Sequence[CandidateSource] | None = None) -> None:
        """Calibrate the prior on ``task``'s tables now (when calibration is on): ``predict``
        and ``table_costs`` then price with the calibrated agent, and the next ``place``
        (of these tables or some of them) plans with it instead of calibrating again."""
        if self.calibration is None:
            return
        self._prepared = calibrate(self.prior, task, self.calibration, sources)
        self.current = self._prepared.agent

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
        out = plan_task(
            self.prior,
            task,
            mode=mode,
            num_samples=num_samples,
            seed=seed,
            sources=sources,
            calibration=self.calibration,
            verify_k=self.verify_k,
            verify_rounds=self.verify_rounds,
            progress=self.progress,
            calibrated=self._prepared,
        )
        self._prepared = None  # one preparation serves one placement
        self.current, self.last_outcome = out.agent, out
        log = logging.getLogger("torchrec_dreamshard.calibration")
        for line in out.lines():
            log.info(line)
        return out.placement

    def fingerprint(self) -> str:
        """The prior's fingerprint and the calibration and verification settings (the
        calibrated weights follow from them on a given machine)."""
        settings = [self.calibration, self.verify_k, self.verify_rounds]
        return hashlib.sha256(f"{self.prior.fingerprint()}|{settings!r}".encode()).hexdigest()

    @property
    def placer(self) -> DreamShard:
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
