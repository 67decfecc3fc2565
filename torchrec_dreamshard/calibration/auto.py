"""Whether the checkpoint prices this machine right, and so whether to calibrate by default.

A cost network is a model of the machine it was trained on. The check takes seconds: the
reference kernel (:data:`~torchrec_dreamshard.measure.embedding_kernels.REFERENCE_TABLES` at
:data:`~torchrec_dreamshard.measure.embedding_kernels.REFERENCE_BATCH_SIZE`, row-wise Adagrad),
timed on this machine (cached per machine), against the network's prediction of it. When
the predicted forward plus backward is off by more than :data:`AUTO_TOLERANCE` either way,
the planner calibrates on the user's tables (:func:`~.fine_tuning.calibrate`) within
:data:`AUTO_BUDGET_S`. Every kernel calibration measures is kept in the calibration store,
so the next plan of these tables on this machine measures nothing and only fine-tunes.

A recalibrated network still has errors, and a search against it finds them. So where the
check calibrates, the plan it picks is also verified on real kernels
(:func:`verification_settings`): it and the next best-rated plan (:data:`AUTO_VERIFY_K`) are
measured beside every heuristic's plan and TorchRec's own plan in interleaved rounds, within
:data:`AUTO_VERIFY_S` (and as much again where the first rounds were noisy), and the chosen
plan stands unless another measured faster in every one of at least two whole rounds; no
plan that did not beat TorchRec's beyond the noise is kept (:func:`~.verification.verify`).
The chosen plan, not the best heuristic's, is the incumbent because the check guards against
the model's gross errors: on a machine whose timings move 5% or more from round to round, a
rule that asks the model's plan to beat the heuristics every time hands back a heuristic's
plan whenever the noise exceeds the gain. Against TorchRec's plan the bar is that high on
purpose: it is the plan the user had, and a swap must never make the step slower. The
rounds are cached per machine and plan set, so
planning the same tables again measures nothing.

Why calibration and not only a speed ratio: the bundled network, trained on an AMD EPYC,
predicts an Intel Xeon's reference kernel about 10x short, and its other kernels are off
by other factors (3.4x on another EPYC VM); one ratio cannot say how every table's time
moves between two machines, while calibration fits the user's own tables (on one such VM
it took held-out workloads from 1.069 to 0.951 of the best heuristic's measured step).
"""

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
    """The reference kernel, predicted against measured on this machine.

    Args:
        predicted_ms: the cost network's ``(fwd, bwd)`` of the reference kernel.
        measured_ms: this machine's, or ``None`` where it was not measured (a device
            this process cannot run, or a caller that pins the machine's models).
        tolerance: relative error of ``fwd + bwd`` above which calibration pays.
    """

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
        k: the best-rated candidate plans measured beside the baselines and heuristics'
            (0: no verification).
        config: the measurement's settings (``None``: the calibration's where a caller
            has one, else :class:`MeasureConfig`'s).
        options: rounds, budget, cache, incumbent, progress and noise limits
            (:class:`VerifyOptions`).
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
    """The settings of a plan's verification, the planner's and ``dreamshard plan``'s
    alike: ``verify_k`` plans as asked (the fastest heuristic's plan the incumbent, no
    budget, no cache); where it is ``None`` (automatic), the default's (see the module
    docstring) if the automatic check calibrates, else none. ``rounds``: interleaved
    rounds."""
    if verify_k is not None:
        return VerificationSettings(verify_k, None, VerifyOptions(rounds=rounds))
    if auto_calibrates:
        options = VerifyOptions(rounds=rounds, budget_s=AUTO_VERIFY_S, cache=True)
        return VerificationSettings(
            AUTO_VERIFY_K, None, dataclasses.replace(options, incumbent="chosen")
        )
    return VerificationSettings(0, None, VerifyOptions(rounds=rounds))


def measured_reference_ms(device: str = "cpu") -> tuple[float, float] | None:
    """This machine's reference kernel ``(fwd, bwd)`` ms, measured once and cached
    (:func:`~torchrec_dreamshard.cache.reference_time.load_reference_ms`)."""
    from torchrec_dreamshard.cache.reference_time import load_reference_ms

    return load_reference_ms(device=device)


def check_machine(
    agent: PlacementAgent, measured_ms: Sequence[float] | None, tolerance: float = AUTO_TOLERANCE
) -> MachineCheck:
    """``agent``'s cost network on the reference kernel against ``measured_ms`` (this
    machine's ``(fwd, bwd)``, ``None`` when not measured)."""
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
    """The one decision of whether and how to calibrate: ``config`` where asked for
    (``automatic`` false) or where the reference kernel says the checkpoint misprices
    this machine; else, automatic, on the kernels a running job of these tables was
    observed on (``observed()``), measuring nothing; else ``None``."""
    if config is None:
        return None
    if not automatic or mispriced:
        return config
    if observed():
        return dataclasses.replace(config, measure_missing=False)
    return None
