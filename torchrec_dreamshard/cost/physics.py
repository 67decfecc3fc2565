"""The physical quantities a fused embedding kernel's time follows, per table: lookups
``B p``, bags ``B``, elements gathered, unique rows, elements updated and table elements,
the gathered and updated ones also split over soft size buckets. Each is a plain count
(a device's is the sum over its tables) over a fixed scale (:data:`SCALES`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from torchrec_dreamshard.data.tables import BIN_MID, TableSpec

SIZE_BUCKETS_LOG10 = (5.0, 6.0, 7.0, 8.0, 9.0)  # bytes: 100 KB ... 1 GB
BASE_NAMES = ("lookups", "bags", "gathered", "unique_rows", "updated", "table_elems")
QUANTITY_NAMES = (
    *BASE_NAMES,
    *(f"gathered@1e{int(b)}B" for b in SIZE_BUCKETS_LOG10),
    *(f"updated@1e{int(b)}B" for b in SIZE_BUCKETS_LOG10),
)
NUM_QUANTITIES = len(QUANTITY_NAMES)
# fixed scales (never fitted), in BASE_NAMES order
_BASE_SCALES = (1e5, 1e4, 1e6, 1e5, 1e6, 1e8)
SCALES = np.array(
    [*_BASE_SCALES, *([1e6] * len(SIZE_BUCKETS_LOG10)), *([1e6] * len(SIZE_BUCKETS_LOG10))]
)


def mean_access_count(hist: np.ndarray) -> float:
    """Mean accesses per accessed row of a reuse histogram (bin means as the counts)."""
    return float(max(np.dot(hist, BIN_MID), 1.0))


def size_bucket_weights(size_bytes: float) -> np.ndarray:
    """Triangular weights of ``log10(size_bytes)`` over :data:`SIZE_BUCKETS_LOG10` (sum 1)."""
    x = math.log10(max(size_bytes, 1.0))
    centres = np.asarray(SIZE_BUCKETS_LOG10)
    x = min(max(x, centres[0]), centres[-1])
    w = np.maximum(0.0, 1.0 - np.abs(x - centres) / (centres[1] - centres[0]))
    return w / w.sum()


def table_quantities(tables: Sequence[TableSpec], batch_size: int) -> np.ndarray:
    """``[T, NUM_QUANTITIES]`` float32 scaled quantities of each table at ``batch_size``."""
    out = np.zeros((len(tables), NUM_QUANTITIES), dtype=np.float64)
    nb = len(SIZE_BUCKETS_LOG10)
    for i, t in enumerate(tables):
        lookups = batch_size * t.pooling_factor
        unique = min(lookups / mean_access_count(t.hist(batch_size)), float(t.rows))
        gathered, updated = lookups * t.dim, unique * t.dim
        base = (lookups, batch_size, gathered, unique, updated, t.rows * t.dim)
        w = size_bucket_weights(t.size_bytes)
        out[i, : len(base)] = base
        out[i, len(base) : len(base) + nb] = gathered * w
        out[i, len(base) + nb :] = updated * w
    return (out / SCALES).astype(np.float32)
