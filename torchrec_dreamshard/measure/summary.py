"""Turn per-round timings into a :class:`PlacementMeasurement` (shared by both backends)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from torchrec_dreamshard.measure.measurements import DeviceCost, PlacementMeasurement


def relative_spread(values: np.ndarray) -> float:
    """``(max - min) / min`` of positive values (0 when fewer than two or all zero)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size < 2 or values.min() <= 0:
        return 0.0
    return float((values.max() - values.min()) / values.min())


def summarise(
    compute: np.ndarray,
    comm: np.ndarray,
    reference: np.ndarray,
    num_tables: list[int],
    backend: str,
    comm_source: str,
    wall_s: float,
) -> PlacementMeasurement:
    """Per-device minimum over rounds of ``compute`` (``[rounds, D, 2]``), ``comm``
    (``[rounds, D]``) and ``reference`` (``[rounds]``); step cost ``max_d (fwd + bwd +
    comm)``; per-round figures in ``extra``."""
    per_device = []
    for d, n in enumerate(num_tables):
        per_device.append(
            DeviceCost(
                fwd_ms=float(compute[:, d, 0].min()),
                bwd_ms=float(compute[:, d, 1].min()),
                comm_ms=float(comm[:, d].min()),
                spread=relative_spread(compute[:, d].sum(axis=1)) if n else 0.0,
                num_tables=n,
            )
        )
    round_steps = (compute.sum(axis=2) + comm).max(axis=1)
    measurement = PlacementMeasurement(
        per_device=per_device,
        step_ms=max(d.total_ms for d in per_device),
        spread=relative_spread(round_steps),
        reference_ms=float(reference.min()),
        backend=backend,
        comm_source=comm_source,
        wall_s=wall_s,
    )
    measurement.extra = {
        "round_step_ms": [float(x) for x in round_steps],
        "round_reference_ms": [float(x) for x in reference],
    }
    return measurement


def reference_scales(reference_ms: Sequence[float | None]) -> list[float]:
    """Per row, ``median reference / row reference`` (1 where it is ``nan`` or ``None``)."""
    refs = [float("nan") if r is None else float(r) for r in reference_ms]
    known = [r for r in refs if math.isfinite(r)]
    typical = float(np.median(known)) if known else 1.0
    return [typical / r if math.isfinite(r) else 1.0 for r in refs]
