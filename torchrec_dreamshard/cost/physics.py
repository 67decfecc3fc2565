"""The physical quantities a fused embedding kernel's time follows, per table.

For a table of ``R`` rows and dim ``d`` in a batch of ``B`` samples with pooling factor
``p`` and reuse histogram ``h`` (fraction of accessed rows by access count):

* lookups ``L = B p`` (ids read; the backward sorts them);
* bags ``B`` (one pooled output per sample: per-bag loop overhead);
* elements gathered ``G = L d`` (the forward's reads, the backward's gradient reads);
* unique rows ``U = L / m``, with ``m = sum_k h_k c_k`` the mean access count of an
  accessed row (``c_k`` the mean count of bin ``k``), at most ``R``: rows the backward
  updates, and the rows the forward fetches from memory rather than from cache;
* elements updated ``U d`` (the row-wise Adagrad update writes them);
* table elements ``R d`` (how much of the table competes for cache).

Whether a read is served from cache depends on the table's size, so ``G`` and ``U d`` are
also split over five soft size buckets (triangular weights in ``log10(bytes)`` centred on
100 KB, 1 MB, 10 MB, 100 MB and 1 GB, summing to 1): a cost model can then charge a
gathered element of a small, cache-resident table less than one of a large table.

Every quantity is a plain count, so a device's value is exactly the **sum** over its
tables, and adding a table never lowers any of them. Each is divided by a fixed scale
(:data:`SCALES`) so that a typical table's values are of order one.
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
# Fixed scales (never fitted): lookups per 1e5, bags per 1e4, elements per 1e6, unique
# rows per 1e5, table elements per 1e8.
_BASE_SCALES = (1e5, 1e4, 1e6, 1e5, 1e6, 1e8)
SCALES = np.array(
    [*_BASE_SCALES, *([1e6] * len(SIZE_BUCKETS_LOG10)), *([1e6] * len(SIZE_BUCKETS_LOG10))]
)


def mean_access_count(hist: np.ndarray) -> float:
    """Mean accesses per accessed row of a reuse histogram (bin means as the counts)."""
    return float(max(np.dot(hist, BIN_MID), 1.0))


def size_bucket_weights(size_bytes: float) -> np.ndarray:
    """Triangular weights of ``log10(size_bytes)`` over :data:`SIZE_BUCKETS_LOG10` (sum 1;
    sizes beyond the outer buckets go wholly to them)."""
    x = math.log10(max(size_bytes, 1.0))
    centres = np.asarray(SIZE_BUCKETS_LOG10)
    x = min(max(x, centres[0]), centres[-1])
    w = np.maximum(0.0, 1.0 - np.abs(x - centres) / (centres[1] - centres[0]))
    return w / w.sum()


def table_quantities(tables: Sequence[TableSpec], batch_size: int) -> np.ndarray:
    """``[T, NUM_QUANTITIES]`` scaled physical quantities of each table at ``batch_size``
    (float32; see the module docstring)."""
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
