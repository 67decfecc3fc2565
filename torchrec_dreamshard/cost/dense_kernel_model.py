"""The model of the dense kernel data-parallel tables run: fwd and bwd ms linear in
:func:`dense_features`, fitted by non-negative least squares and cached per machine.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from torchrec_dreamshard.cache.machine_cache import (
    CacheFile,
    load_cached,
    loaded_memo,
    machine_cache_file,
    named_file,
)
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.measure.dense_kernels import time_dense_sets
from torchrec_dreamshard.measure.hardware import device_name
from torchrec_dreamshard.measure.spent import spent_on

FORMAT_VERSION = 1  # of the cache file; a reader refuses other versions
FEATURES = ("ms", "ms_per_table", "ms_per_mb_gathered", "ms_per_mb_output", "ms_per_mb_weights")


def dense_features(tables: Sequence[TableSpec], batch_size: int) -> np.ndarray:
    """``[1, n, G, O, W]`` of one dense kernel: tables, MB gathered (``b sum p d``), MB of
    outputs (``b sum d``), MB of weights (``sum R d``), fp32."""
    gathered = batch_size * sum(t.pooling_factor * t.dim for t in tables) * 4 / 1e6
    outputs = batch_size * sum(t.dim for t in tables) * 4 / 1e6
    weights = sum(t.rows * t.dim for t in tables) * 4 / 1e6
    return np.array([1.0, len(tables), gathered, outputs, weights])


@dataclass
class DenseKernelModel:
    """The fitted dense-kernel model.

    Args:
        fwd: the forward's coefficients, in the order of :data:`FEATURES`.
        bwd: the backward's (dense optimizer step included), same order.
        samples: timed sets it was fitted on.
        mape: mean absolute relative error of fwd + bwd over them (``None``: not fitted).
    """

    fwd: tuple[float, ...]
    bwd: tuple[float, ...]
    device: str = "cpu"
    source: str = ""
    samples: int = 0
    mape: float | None = None
    version: int = field(default=FORMAT_VERSION)

    def __post_init__(self) -> None:
        for name in ("fwd", "bwd"):
            coef = tuple(float(x) for x in getattr(self, name))
            if len(coef) != len(FEATURES) or not all(x >= 0 for x in coef):
                raise ValueError(
                    f"dense kernel model {name} needs {len(FEATURES)} coefficients >= 0 "
                    f"({', '.join(FEATURES)}), got {getattr(self, name)!r}"
                )
            setattr(self, name, coef)

    def ms(self, tables: Sequence[TableSpec], batch_size: int) -> tuple[float, float]:
        """``(fwd_ms, bwd_ms)`` of one dense kernel over ``tables`` at ``batch_size``."""
        if not tables:
            return 0.0, 0.0
        x = dense_features(tables, batch_size)
        return float(np.dot(self.fwd, x)), float(np.dot(self.bwd, x))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> DenseKernelModel:
        if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
            found = data.get("version") if isinstance(data, dict) else type(data).__name__
            raise ValueError(
                f"dense kernel model needs format version {FORMAT_VERSION}, got {found}"
            )
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(f"dense kernel model is malformed ({exc})") from None


def nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares of relative errors, the most negative column dropped until none is."""
    w = 1.0 / np.maximum(y, 1e-3)
    x, y = x * w[:, None], y * w
    keep = list(range(x.shape[1]))
    while True:
        coef = np.zeros(x.shape[1])
        coef[keep] = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
        worst = min(keep, key=lambda j: coef[j])
        if coef[worst] >= 0:
            return coef
        keep.remove(worst)


def fit_dense_kernel_model(
    samples: Sequence[tuple[Sequence[TableSpec], int, float, float]], device: str, source: str
) -> DenseKernelModel:
    """The model from ``(tables, batch, fwd_ms, bwd_ms)`` timings."""
    if len(samples) < len(FEATURES):
        raise ValueError(f"fitting needs at least {len(FEATURES)} timed sets, got {len(samples)}")
    x = np.stack([dense_features(tables, b) for tables, b, _, _ in samples])
    fwd = nonnegative_lstsq(x, np.array([s[2] for s in samples]))
    bwd = nonnegative_lstsq(x, np.array([s[3] for s in samples]))
    total = np.array([s[2] + s[3] for s in samples])
    mape = float(np.mean(np.abs(x @ fwd + x @ bwd - total) / total))
    return DenseKernelModel(
        tuple(fwd), tuple(bwd), device=device, source=source, samples=len(samples), mape=mape
    )


@spent_on("dense_kernel")
def calibrate_dense_kernel_model(device: str = "cpu") -> DenseKernelModel:
    """Time random dense table sets on this machine and fit the model."""
    name = device_name(device)
    samples = time_dense_sets(device)
    return fit_dense_kernel_model(samples, device, f"FBGEMM dense kernel + Adagrad on {name}")


def dense_kernel_cache_file(device: str = "cpu") -> CacheFile:
    """This machine's cache file of the fitted model on ``device``."""
    return machine_cache_file("dense_kernel", device, device, format=FORMAT_VERSION)


def default_dense_kernel_path(device: str = "cpu") -> Path:
    """Where :func:`dense_kernel_cache_file` is."""
    return dense_kernel_cache_file(device).path


_LOADED: dict[str, DenseKernelModel] = loaded_memo()


def load_dense_kernel_model(
    path: str | os.PathLike | None = None, device: str = "cpu"
) -> DenseKernelModel:
    """The fitted model from ``path`` (default: this machine's), timed first if missing."""
    file = named_file(path) if path is not None else dense_kernel_cache_file(device)
    return load_cached(
        file,
        "dense kernel model file",
        DenseKernelModel.from_dict,
        lambda: calibrate_dense_kernel_model(device),
        DenseKernelModel.to_dict,
        _LOADED,
    )
