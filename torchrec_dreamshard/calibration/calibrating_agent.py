""":class:`CalibratingAgent`, which calibrates and verifies in ``place``."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from torchrec_dreamshard.calibration.adaptation_report import adaptation_lines, verification_record
from torchrec_dreamshard.calibration.auto import (
    MachineCheck,
    VerificationSettings,
    calibration_to_run,
    check_machine,
    verification_settings,
)
from torchrec_dreamshard.calibration.fine_tuning import (
    CalibrationConfig,
    CalibrationResult,
    calibrate,
    stored_observations,
)
from torchrec_dreamshard.calibration.planning import PlanOutcome, plan_task
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.policy.protocol import PlaceSettings
from torchrec_dreamshard.verification.verify_result import VerifyResult

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy import CandidateSource, CostPrediction, DreamShard, SafetyReport

# adaptation_lines is re-exported: the planner's stats and the demo import it from here
__all__ = ["CalibratingAgent", "adaptation_lines"]


class CalibratingAgent:
    """A :class:`~torchrec_dreamshard.policy.PlacementAgent` whose ``place`` calibrates first
    and verifies after (:func:`plan_task`); other members use the calibrated agent.

    Args:
        calibration: calibration settings (``None``: verification only).
        verify_k: candidates to verify (0: none; ``None``: automatic, see :mod:`.auto`).
        auto: ``() -> (fwd, bwd)`` reference ms of this machine: calibrate only where
            :func:`~.auto.check_machine` finds the checkpoint misprices it (``None``:
            whenever ``calibration`` is given).
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
        """Whether ``place`` calibrates on this machine."""
        if self.calibration is None:
            return False
        if self._auto is None:
            return True
        if self.check is None:
            self.check = check_machine(self.prior, self._auto())
        return self.check.mispriced

    def verification(self) -> VerificationSettings:
        """The verification to run: as given, or the automatic one."""
        if self.verify_k is not None:
            return verification_settings(self.verify_k, False, self.verify_rounds)
        auto_calibrates = self._auto is not None and self.calibration_enabled
        return verification_settings(None, auto_calibrates, self.verify_rounds)

    def _settings(self, task: Task) -> CalibrationConfig | None:
        """How ``place`` / ``prepare`` calibrate on ``task`` (``None``: not at all)."""
        automatic = self._auto is not None
        mispriced = self.calibration is not None and self.calibration_enabled
        config = calibration_to_run(
            self.calibration,
            automatic,
            mispriced,
            lambda: stored_observations(self.calibration, task),
        )
        self.learns_from_job = automatic and config is not None and not mispriced
        return config

    def adaptation(self) -> dict[str, Any]:
        """How planning adapted to this machine, JSON-able."""
        out: dict[str, Any] = {"mode": "auto" if self._auto is not None else "on"}
        if self.calibration is None:
            out.update(mode="off", why="verification only")
        elif self._auto is not None and self.check is not None:
            out.update(self.check.to_dict(), why=self.check.why())
            if self.learns_from_job:
                out["why"] += "; learning from the kernels observed in a running job"
        elif self._auto is not None:
            out["why"] = "the reference kernel was not measured here: planning with the checkpoint"
        else:
            out["why"] = "calibrate was asked for"
        cal = self.last_calibration
        out["calibrated"] = cal is not None
        if cal is not None:
            out.update(cal.summary())
        if out["calibrated"] and self.check is not None:
            out["reference_error_after"] = check_machine(self.current, self.check.measured_ms).error
        ver = self.last_verification
        out.update(verification_record(ver))
        if self.last_outcome is not None and self.last_outcome.margins:
            out["margins"] = self.last_outcome.margins
        failed = [*(cal.failures if cal is not None else [])]
        failed += [ver.failure] if ver is not None and ver.failure is not None else []
        out["measure_failures"] = [f.to_dict() for f in failed]
        return out

    def prepare(self, task: Task, sources: Sequence[CandidateSource] | None = None) -> None:
        """Calibrate on ``task``'s tables now; the next ``place`` of them reuses it."""
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
        """Calibrate (unless :meth:`prepare` did), place and verify (:attr:`last_outcome`)."""
        out = plan_task(
            self.prior,
            task,
            how=PlaceSettings(mode, num_samples, seed, sources),
            calibration=self._settings(task),
            verification=self.verification(),
            calibrated=self._prepared,
            progress=self.progress,
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
        """The prior's fingerprint and the calibration and verification settings."""
        settings = [self.calibration, self.verify_k, self.verify_rounds, self._auto is not None]
        return hashlib.sha256(f"{self.prior.fingerprint()}|{settings!r}".encode()).hexdigest()

    @property
    def without_measuring(self) -> DreamShard:
        """The agent that places without measuring (the calibrated one, else the prior)."""
        return self.current

    @property
    def meta(self) -> dict[str, Any]:
        """The current agent's metadata."""
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
