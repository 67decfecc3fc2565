"""The agent a planner's components price and place with (:class:`PlanAgent`), and how the
planner adapts to the machine (:class:`AdaptSettings`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from torchrec_dreamshard.calibration.auto import VerificationSettings, verification_settings
from torchrec_dreamshard.calibration.fine_tuning import CalibrationConfig
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.policy.agent import DreamShard
from torchrec_dreamshard.policy.protocol import PlacementAgent
from torchrec_dreamshard.profile.machine_profile import MachineProfile

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy import CandidateSource, CostPrediction, SafetyReport


@dataclass(frozen=True)
class AdaptSettings:
    """How a planner adapts to the machine: what ``calibrate`` and ``verify`` decoded to.

    Attributes:
        calibration: the calibration the profile step may run (``None``: never).
        automatic: calibrate only where the checkpoint misprices the reference kernel
            (``calibrate=None``), and verify by default where it did.
        verify_k: candidate plans the verification measures (``None``: automatic; 0: none).
        verify_rounds: the verification's interleaved rounds.
    """

    calibration: CalibrationConfig | None = None
    automatic: bool = False
    verify_k: int | None = 0
    verify_rounds: int = 3

    def verification(self, calibrated: bool) -> VerificationSettings:
        """The verification of a plan whose profile ``calibrated`` (or not)."""
        return verification_settings(
            self.verify_k, self.automatic and calibrated, self.verify_rounds
        )

    @property
    def adapts(self) -> bool:
        """Whether the planner may calibrate or verify at all."""
        return self.calibration is not None or bool(self.verify_k) or self.automatic


class PlanAgent:
    """The agent every component of a plan prices and places with: the checkpoint's
    (``prior``) until the planner binds a plan's profile, then that profile's agent.
    It measures nothing.
    """

    def __init__(self, prior: PlacementAgent) -> None:
        self.prior = prior
        self._current = prior
        self._calibrated = False
        self._profile: MachineProfile | None = None

    def bind(self, profile: MachineProfile) -> None:
        """Price and place with ``profile``'s agent (once per plan, after the profile step)."""
        self._profile = profile
        if isinstance(self.prior, DreamShard):
            self._current = profile.agent(self.prior)
        self._calibrated = self._current is not self.prior

    @property
    def profile(self) -> MachineProfile | None:
        """The machine profile of the plan being made (``None`` before the first)."""
        return self._profile

    @property
    def current(self) -> PlacementAgent:
        """The agent the components price and place with."""
        return self._current

    @property
    def calibration_enabled(self) -> bool:
        """Whether the bound agent's kernels were fitted on this machine."""
        return self._calibrated

    @property
    def without_measuring(self) -> PlacementAgent:
        return self._current.without_measuring

    @property
    def meta(self) -> dict[str, Any]:
        return self._current.meta

    @property
    def last_report(self) -> SafetyReport | None:
        """The bound agent's safety-net report (the policy protocol's member)."""
        return self._current.last_report

    @last_report.setter
    def last_report(self, report: SafetyReport | None) -> None:
        self._current.last_report = report

    def prepare(self, task: Task, sources: Sequence[CandidateSource] | None = None) -> None:
        """Nothing: the profile step measured what the plan prices with."""
        del task, sources

    def place(
        self,
        task: Task,
        mode: str = "safe",
        num_samples: int = 4,
        seed: int = 0,
        sources: Sequence[CandidateSource] | None = None,
    ) -> list[int]:
        return self._current.place(task, mode, num_samples, seed, sources=sources)

    def predict(self, task: Task, placement: Sequence[int]) -> CostPrediction:
        return self._current.predict(task, placement)

    def table_costs(self, task: Task) -> np.ndarray:
        return self._current.table_costs(task)

    def fingerprint(self) -> str:
        """The prior's: what the planner's plans depend on (the profile is hashed apart)."""
        return self.prior.fingerprint()


def bound_agent(agent: PlacementAgent) -> PlacementAgent:
    """The agent a :class:`PlanAgent` is bound to (``agent`` itself otherwise)."""
    return agent.current if isinstance(agent, PlanAgent) else agent
