"""The model of a collective's time, ``t(D, v) = a + b (D - 1) + c v`` ms (``v`` the MB a
device sends plus receives), and its least-squares fit."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from torchrec_dreamshard.measure.comm import table_wise_flows


@dataclass
class CommModel:
    """``t(D, MB) = latency_ms + per_peer_ms * (D - 1) + ms_per_mb * MB`` per collective.

    Args:
        samples: timings the fit used.
        rmse_ms: root mean square error of the fit on them.
    """

    latency_ms: float
    per_peer_ms: float
    ms_per_mb: float
    source: str = ""
    samples: int = 0
    rmse_ms: float = 0.0

    def collective_ms(self, num_devices: int, megabytes: float) -> float:
        """One collective's ms for a device moving ``megabytes`` (0 for one device)."""
        if num_devices <= 1:
            return 0.0
        return self.latency_ms + self.per_peer_ms * (num_devices - 1) + self.ms_per_mb * megabytes

    def all_to_all_ms(self, flows: np.ndarray, ranks: Iterable[int] | None = None) -> np.ndarray:
        """``[W]`` ms of one all-to-all of ``flows`` (``[W, W]`` bytes ``i`` sends ``j``) over
        ``ranks`` (default: all; 0 outside them)."""
        f = np.array(flows, dtype=np.float64)
        np.fill_diagonal(f, 0.0)
        idx = sorted(set(range(len(f)) if ranks is None else ranks))
        out = np.zeros(len(f))
        for r in idx:
            out[r] = self.collective_ms(len(idx), (f[r].sum() + f[:, r].sum()) / 1e6)
        return out

    def device_comm_ms(
        self, dims: Sequence[int], batch_size: int, elem_bytes: int = 4
    ) -> list[float]:
        """Forward + backward table-wise all-to-all ms of every device, from pooled widths."""
        flows = table_wise_flows(dims, batch_size, elem_bytes)
        return [float(ms) for ms in self.all_to_all_ms(flows) + self.all_to_all_ms(flows.T)]


def fit_comm_model(
    samples: Sequence[tuple[int, float, float]], source: str, what: str = "collective"
) -> CommModel:
    """Least squares of ``(num_devices, MB, ms)`` samples of one ``what`` collective.

    With one group size only, the per-peer term is 0 and the model holds at that size.
    """
    arr = np.asarray(samples, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 3:
        raise ValueError(f"fitting the {what} model needs at least 3 samples")
    design = np.stack([np.ones(len(arr)), arr[:, 0] - 1, arr[:, 1]], axis=1)
    if np.all(arr[:, 0] == arr[0, 0]):
        design[:, 1] = 0.0
    coef, *_ = np.linalg.lstsq(design, arr[:, 2], rcond=None)
    coef = np.maximum(coef, 0.0)
    rmse = float(np.sqrt(np.mean((design @ coef - arr[:, 2]) ** 2)))
    return CommModel(*(float(c) for c in coef), source=source, samples=len(arr), rmse_ms=rmse)
