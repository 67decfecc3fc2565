"""What a measurement runs: optimizer, precision, device and the timing protocol."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

# Optimizers the fused kernels support on every device, by the name users give.
OPTIMIZERS = ("rowwise_adagrad", "sgd", "adagrad")
PRECISIONS = ("fp32", "fp16")
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True, kw_only=True)
class MeasureConfig:
    """How placements are measured: each device's figure is the minimum over ``rounds``
    (which visit every device in turn) of the median over ``iters`` timed iterations.

    Args:
        optimizer: the fused optimizer: ``"rowwise_adagrad"``, ``"sgd"`` or ``"adagrad"``.
        precision: weight precision, ``"fp32"`` or ``"fp16"`` (fp16 on CUDA only).
        device: ``"cpu"`` (one thread stands for one device) or ``"cuda"``.
        warmup: untimed iterations before the first round of each kernel.
        iters: timed iterations per round (each on a fresh batch of ids).
        rounds: rounds per measurement; the figure is the minimum of the rounds' medians.
        seed: seeds the batches of ids.
        comm_model_path: JSON file of the collective models (default: this machine's gloo
            fit in the cache directory).
        compute_in_turn: distributed backend only: ranks time their kernels one at a time,
            so ranks sharing CPU cores do not slow each other (``None``: on CPU only).
    """

    optimizer: str = "rowwise_adagrad"
    precision: str = "fp32"
    device: str = "cpu"
    warmup: int = 2
    iters: int = 5
    rounds: int = 3
    seed: int = 0
    comm_model_path: str | None = None
    compute_in_turn: bool | None = None

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.precision == "fp16" and self.device == "cpu":
            raise ValueError(
                "precision 'fp16' needs device 'cuda': FBGEMM's CPU kernels train fp32 weights"
            )
        for name, low in (("warmup", 0), ("iters", 1), ("rounds", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")

    @property
    def in_turn(self) -> bool:
        """Whether distributed ranks time their kernels one at a time."""
        if self.compute_in_turn is None:
            return self.device == "cpu"
        return self.compute_in_turn

    def workload(self, batch_size: int) -> dict[str, Any]:
        """The workload a measurement was taken under (what the store keys rows by)."""
        return {
            "batch_size": int(batch_size),
            "optimizer": self.optimizer,
            "precision": self.precision,
            "device": self.device,
        }

    def workload_key(self, batch_size: int) -> str:
        """A short readable key of :meth:`workload`, e.g. ``b2048-rowwise_adagrad-fp32-cpu``."""
        w = self.workload(batch_size)
        return f"b{w['batch_size']}-{w['optimizer']}-{w['precision']}-{w['device']}"

    def protocol(self) -> dict[str, Any]:
        """The timing protocol (stored beside each row, not part of the workload key)."""
        return {k: v for k, v in asdict(self).items() if k in ("warmup", "iters", "rounds", "seed")}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stable_key(data: Any, length: int = 12) -> str:
    """A short hash of JSON-able ``data`` (keys sorted)."""
    blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha1(blob).hexdigest()[:length]
