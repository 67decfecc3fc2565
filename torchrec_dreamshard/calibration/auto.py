"""Whether the checkpoint prices this machine right (:class:`MachineCheck`), and so whether
to calibrate and verify by default (:func:`verification_settings`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.verification.verification import VerifyOptions

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.calibration.fine_tuning import CalibrationConfig
    from torchrec_dreamshard.policy import PlacementAgent

AUTO_TOLERANCE = 0.25  # calibrate when the reference kernel is mispriced by more than 25%
AUTO_BUDGET_S = 20.0  # seconds of automatic calibration (measuring and fine-tuning)
AUTO_VERIFY_K = 2  # the chosen plan and the next best-rated, measured beside the heuristics'
AUTO_VERIFY_S = 25.0  # seconds of automatic verification (cached: measured once per plan set)


@dataclass(frozen=True)
class MachineCheck:
    """The reference kernel's ``(fwd, bwd)`` ms, predicted against measured here (``None``:
    not measured); mispriced beyond ``tolerance`` of ``fwd + bwd``."""

    predicted_ms: tuple[float, float]
    measured_ms: tuple[float, float] | None
    tolerance: float = AUTO_TOLERANCE

    @property
    def error(self) -> float | None:
        """``predicted / measured - 1`` of fwd + bwd (-0.9: predicted 10x short)."""
        if self.measured_ms is None or sum(self.measured_ms) <= 0:
            return None
        return sum(self.predicted_ms) / sum(self.measured_ms) - 1.0

    @property
    def mispriced(self) -> bool:
        """Whether the prediction is off by more than the tolerance, either way."""
        error = self.error
        if error is None:
            return False
        ratio = error + 1.0
        return max(ratio, 1.0 / max(ratio, 1e-9)) > 1.0 + self.tolerance

    def why(self) -> str:
        """One line: what was found, and so what the planner does."""
        if self.measured_ms is None:
            return "the reference kernel was not measured here: planning with the checkpoint"
        verdict = (
            "calibrating on this machine"
            if self.mispriced
            else f"within {self.tolerance:.0%}: planning with the checkpoint"
        )
        return (
            f"the checkpoint predicts the reference kernel at {sum(self.predicted_ms):.2f} ms, "
            f"measured {sum(self.measured_ms):.2f} ms here ({self.error:+.0%}): {verdict}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference_predicted_ms": sum(self.predicted_ms),
            "reference_measured_ms": None if self.measured_ms is None else sum(self.measured_ms),
            "reference_error": self.error,
            "tolerance": self.tolerance,
        }


@dataclass(frozen=True)
class VerificationSettings:
    """A plan's verification as one value: how many candidates, measured how, kept how.

    Attributes:
        k: best-rated plans measured beside the baselines (0: no verification).
        config: the measurement's settings (``None``: the caller's, else the default).
        options: rounds, budget, cache, incumbent, progress and noise limits.
    """

    k: int = 0
    config: MeasureConfig | None = None
    options: VerifyOptions = field(default_factory=VerifyOptions)

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"verify must be >= 0 candidate plans, got {self.k}")


def verification_settings(
    verify_k: int | None, auto_calibrates: bool, rounds: int = 3
) -> VerificationSettings:
    """``verify_k`` plans as asked (no budget, no cache); where ``None``, the automatic
    default if the check calibrates, else none."""
    if verify_k is not None:
        return VerificationSettings(verify_k, None, VerifyOptions(rounds=rounds))
    if auto_calibrates:
        options = VerifyOptions(rounds=rounds, budget_s=AUTO_VERIFY_S, cache=True)
        return VerificationSettings(
            AUTO_VERIFY_K, None, dataclasses.replace(options, incumbent="chosen")
        )
    return VerificationSettings(0, None, VerifyOptions(rounds=rounds))


def measured_reference_ms(device: str = "cpu") -> tuple[float, float] | None:
    """This machine's reference kernel ``(fwd, bwd)`` ms, measured once and cached."""
    from torchrec_dreamshard.cache.reference_time import load_reference_ms

    return load_reference_ms(device=device)


def check_machine(
    agent: PlacementAgent, measured_ms: Sequence[float] | None, tolerance: float = AUTO_TOLERANCE
) -> MachineCheck:
    """``agent``'s cost network on the reference kernel against ``measured_ms``."""
    from torchrec_dreamshard.cost.plans import cost_network_kernel
    from torchrec_dreamshard.measure.embedding_kernels import REFERENCE_BATCH_SIZE, REFERENCE_TABLES

    predicted = cost_network_kernel(agent)(list(REFERENCE_TABLES), REFERENCE_BATCH_SIZE)
    measured = None if measured_ms is None else (float(measured_ms[0]), float(measured_ms[1]))
    return MachineCheck(predicted, measured, tolerance)


def calibration_to_run(
    config: CalibrationConfig | None,
    automatic: bool,
    mispriced: bool,
    observed: Callable[[], bool],
) -> CalibrationConfig | None:
    """Whether and how to calibrate: ``config`` where asked for or mispriced; else, on
    kernels a running job was ``observed()`` on, measuring nothing; else ``None``."""
    if config is None:
        return None
    if not automatic or mispriced:
        return config
    if observed():
        return dataclasses.replace(config, measure_missing=False)
    return None
