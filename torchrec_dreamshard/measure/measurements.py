"""Result types of a measurement."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class DeviceCost:
    """What one device costs per training step.

    Args:
        fwd_ms: the fused kernel's forward.
        bwd_ms: its backward, fused optimizer update included.
        comm_ms: the all-to-all of pooled embeddings, forward plus backward.
        spread: ``(max - min) / min`` of the rounds' ``fwd_ms + bwd_ms`` medians.
        num_tables: tables on the device.
    """

    fwd_ms: float
    bwd_ms: float
    comm_ms: float
    spread: float = 0.0
    num_tables: int = 0

    @property
    def total_ms(self) -> float:
        """``fwd_ms + bwd_ms + comm_ms``."""
        return self.fwd_ms + self.bwd_ms + self.comm_ms

    @property
    def compute_ms(self) -> float:
        """``fwd_ms + bwd_ms``."""
        return self.fwd_ms + self.bwd_ms

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceCost:
        return cls(**data)


@dataclass
class PlacementMeasurement:
    """A placement measured on real kernels.

    Args:
        per_device: one :class:`DeviceCost` per device (empty when the measurement failed).
        step_ms: the step cost, ``max_d (fwd + bwd + comm)``.
        spread: relative spread of the step cost over rounds, ``(max - min) / min``.
        reference_ms: the reference kernel's forward + backward in the same rounds.
        ok: False when the measurement failed (out of memory, kernel error).
        error: what went wrong, when ``ok`` is False.
        backend: ``"local"`` or ``"distributed"``.
        comm_source: where ``comm_ms`` came from.
        wall_s: seconds the measurement took.
    """

    per_device: list[DeviceCost]
    step_ms: float
    spread: float
    reference_ms: float
    ok: bool = True
    error: str | None = None
    backend: str = "local"
    comm_source: str = ""
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def failed(cls, error: str, backend: str, wall_s: float = 0.0) -> PlacementMeasurement:
        """A failed measurement (it is still recorded, so a collection can go on)."""
        nan = math.nan
        return cls([], nan, nan, nan, ok=False, error=error, backend=backend, wall_s=wall_s)

    @property
    def normalised_step(self) -> float:
        """The step cost in units of the reference kernel (machine speed factored out)."""
        return self.step_ms / self.reference_ms

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["per_device"] = [d.to_dict() for d in self.per_device]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlacementMeasurement:
        data = dict(data)
        data["per_device"] = [DeviceCost.from_dict(d) for d in data["per_device"]]
        return cls(**data)
