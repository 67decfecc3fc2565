"""What :func:`~.fine_tuning.calibrate` did (:class:`CalibrationResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchrec_dreamshard.measure.guard import MeasureFailure, failures_to_dicts

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy import DreamShard


@dataclass
class CalibrationResult:
    """What :func:`calibrate` did.

    Attributes:
        agent: the calibrated agent (the prior where nothing could be fitted).
        measured: kernels measured now.
        reused: kernels found in the store.
        skipped: kernels left unmeasured for lack of budget.
        seconds: wall time of the calibration.
        measure_s: of which measuring.
        samples: the kernels fitted on.
        before: the prior's accuracy on them (``cost/mape``, ``cost/log_std``).
        after: the calibrated model's (in-sample).
        store: the store's path.
        drift: the reference kernel's ``after / before - 1`` (``None``: not timed).
        discarded: kernels discarded because the reference drifted past ``drift_limit``.
        failures: measurements that failed on this machine, skipped.
    """

    agent: DreamShard
    measured: int
    reused: int
    skipped: int
    seconds: float
    measure_s: float
    samples: int
    before: dict[str, float]
    after: dict[str, float]
    store: str
    drift: float | None = None
    discarded: int = 0
    failures: list[MeasureFailure] = field(default_factory=list)

    @classmethod
    def failed(
        cls, agent: DreamShard, failures: list[MeasureFailure], store: str, seconds: float
    ) -> CalibrationResult:
        """A calibration that failed as a whole: the prior ``agent`` as it is, and why."""
        return cls(
            agent=agent,
            measured=0,
            reused=0,
            skipped=0,
            seconds=seconds,
            measure_s=0.0,
            samples=0,
            before={},
            after={},
            store=store,
            failures=list(failures),
        )

    @property
    def note(self) -> str:
        """What the drift check and the failures did, for people (``""``: nothing)."""
        notes = []
        if self.discarded:
            notes.append(
                f"the reference kernel drifted {self.drift:+.0%} while calibrating: the "
                f"machine was busy, so the {self.discarded} kernels measured then were "
                "discarded, not learned as this machine's speed"
                + (f" ({self.measured} measured while it was steady kept)" if self.measured else "")
            )
        if self.failures:
            more = f" ({len(self.failures)} measurements failed)" if len(self.failures) > 1 else ""
            notes.append(f"measuring failed: {self.failures[0].describe()}{more}")
        if notes and not self.samples:
            notes.append("the checkpoint is used as it is")
        return "; ".join(notes)

    def summary(self) -> dict[str, Any]:
        """What it measured and bought, as the planner's adaptation record reports it."""
        return {
            "seconds": self.seconds,
            "kernels_measured": self.measured,
            "kernels_reused": self.reused,
            "kernels_skipped": self.skipped,
            "kernel_mape_before": self.before.get("cost/mape"),
            "kernel_mape_after": self.after.get("cost/mape"),
            "calibration_drift": self.drift,
            "kernels_discarded": self.discarded,
            "calibration_note": self.note,
        }

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "agent"}
        out["failures"] = failures_to_dicts(self.failures)
        return out

    def lines(self) -> list[str]:
        return [
            f"calibration: {self.measured} kernels measured, {self.reused} reused from "
            f"{self.store}, {self.skipped} skipped (budget) in {self.seconds:.1f}s "
            f"(measuring {self.measure_s:.1f}s)",
            f"  kernel time MAPE on the {self.samples} calibration kernels: "
            f"{self.before.get('cost/mape', float('nan')):.1f}% before, "
            f"{self.after.get('cost/mape', float('nan')):.1f}% after (in-sample)",
            *([f"  {self.note}"] if self.note else []),
        ]
