"""Planning with calibration and verification: :func:`plan_task` and the agent that
does it on every ``place`` (:class:`CalibratingAgent`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torchrec_dreamshard.calibration.fit import CalibrationConfig, CalibrationResult, calibrate
from torchrec_dreamshard.calibration.verification import VerifyResult, verify
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.tasks import Task


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
    agent: Any
    calibration: CalibrationResult | None = None
    verification: VerifyResult | None = None

    def lines(self) -> list[str]:
        out = self.calibration.lines() if self.calibration else []
        return out + (self.verification.lines() if self.verification else [])


def plan_task(
    agent: Any,
    task: Task,
    *,
    mode: str = "safe",
    num_samples: int = 4,
    seed: int = 0,
    calibration: CalibrationConfig | None = None,
    verify_k: int = 0,
    verify_rounds: int = 3,
    verify_config: MeasureConfig | None = None,
    progress: bool = False,
) -> PlanOutcome:
    """Calibrate (when ``calibration`` is given), place, and verify (when ``verify_k``).

    Args:
        agent: the prior agent (unchanged).
        task: the task.
        mode, num_samples, seed: as ``DreamShard.place``.
        calibration: calibration settings; ``None`` plans with ``agent`` as it is.
        verify_k: measure the ``verify_k`` best-rated candidates and the heuristics' plans
            and keep what :func:`~.verification.rank_measured` picks (0: no verification).
        verify_rounds: interleaved rounds of the verification.
        verify_config: its measurement settings (default: the calibration's, else
            :class:`MeasureConfig`'s).
        progress: tqdm bars.
    """
    if verify_k < 0:
        raise ValueError(f"verify must be >= 0 candidate plans, got {verify_k}")
    cal = calibrate(agent, task, calibration) if calibration is not None else None
    planner = cal.agent if cal is not None else agent
    placement = planner.place(task, mode=mode, num_samples=num_samples, seed=seed)
    ver = None
    if verify_k:
        mcfg = verify_config or (calibration.measure if calibration is not None else None)
        ver = verify(
            planner, task, verify_k, mcfg, verify_rounds, seed, progress, {"chosen": placement}
        )
        placement = list(ver.winner.placement)
    return PlanOutcome(placement, planner, cal, ver)


class CalibratingAgent:
    """An agent (``PlacementAgent``) whose ``place`` calibrates on the task's tables
    first and verifies the best candidates after (:func:`plan_task`); ``predict`` and
    everything else use the calibrated agent once there is one.

    Args:
        agent: the prior agent.
        calibration: calibration settings (``None``: verification only).
        verify_k: candidates to verify by measuring (0: none).
        verify_rounds: interleaved rounds of the verification.
        progress: tqdm bars.
    """

    def __init__(
        self,
        agent: Any,
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
        self.calibration_enabled = True

    def place(self, task: Task, mode: str = "safe", num_samples: int = 4, seed: int = 0):
        import logging

        out = plan_task(
            self.prior,
            task,
            mode=mode,
            num_samples=num_samples,
            seed=seed,
            calibration=self.calibration,
            verify_k=self.verify_k,
            verify_rounds=self.verify_rounds,
            progress=self.progress,
        )
        self.current, self.last_outcome = out.agent, out
        log = logging.getLogger("torchrec_dreamshard.calibration")
        for line in out.lines():
            log.info(line)
        return out.placement

    @property
    def placer(self) -> Any:
        """The agent that places without measuring: the calibrated agent once ``place``
        has calibrated (the prior before). The split search re-places shards with it, so
        that trying a split does not calibrate and verify again."""
        return self.current

    def predict(self, task: Task, placement: Sequence[int]):
        return self.current.predict(task, placement)

    def table_costs(self, task: Task):
        return self.current.table_costs(task)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("current", "prior"):
            raise AttributeError(name)
        return getattr(self.current, name)
