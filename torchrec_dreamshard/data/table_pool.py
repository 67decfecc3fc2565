"""The synthetic table pool shaped like Meta's open DLRM embedding dataset, the dataset's
published access statistics and the pool's statistics to compare them with."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from torchrec_dreamshard.data.tables import BIN_MID, NUM_REUSE_BINS, TableSpec

# Share of index accesses by reuse factor published with Meta's open DLRM embedding dataset
# (bins (0,1], (1,2], (2,4], ..., (8192,16384], beyond).
DLRM_PUBLISHED_ACCESS_SHARE: tuple[float, ...] = (
    (0.069, 0.044, 0.068, 0.101, 0.121, 0.104, 0.073, 0.058)  # bins (0,1] to (64,128]
    + (0.052, 0.050, 0.049, 0.048, 0.048, 0.042, 0.031, 0.042)  # bins (128,256] and up
)
DLRM_PUBLISHED_ROWS_ACCESSED_ONCE = 0.47
DLRM_NUM_TABLES = 856
DLRM_BATCH_SIZE = 65536
# Row scale at which the synthetic pool's tables run comfortably on a 2-core CPU.
CPU_POOL_SCALE = 0.1


def fold_published_share(access_share: Sequence[float]) -> np.ndarray:
    """The published 16-bin share as 17 bins (its last bin split over 15 and 16)."""
    share = np.asarray(access_share, dtype=np.float64)
    if share.size == NUM_REUSE_BINS - 1:
        share = np.concatenate([share[:-1], [share[-1] / 2, share[-1] / 2]])
    if share.size != NUM_REUSE_BINS:
        raise ValueError(f"access share must have {NUM_REUSE_BINS} or 16 bins, got {share.size}")
    return share


def to_published_bins(share: Sequence[float]) -> np.ndarray:
    """Our 17-bin share as the published 16 bins."""
    share = np.asarray(share, dtype=np.float64)
    return np.concatenate([share[:15], [share[15:].sum()]])


def access_share_to_row_hist(access_share: Sequence[float]) -> np.ndarray:
    """A share of accesses by reuse bin as the 17-bin fraction of accessed rows
    (``share_k / mid_k``, renormalised)."""
    rows = fold_published_share(access_share) / BIN_MID
    return rows / rows.sum()


def row_hist_to_access_share(hist: Sequence[float]) -> np.ndarray:
    """Inverse of :func:`access_share_to_row_hist` (17 bins)."""
    acc = np.asarray(hist, dtype=np.float64) * BIN_MID
    return acc / acc.sum()


# A table's histogram must be achievable: the rows it touches per batch (at the dataset's
# batch size, unscaled rows) stay within this share of its rows.
_MAX_TOUCHED_SHARE = 0.8
_CALIBRATION_ROUNDS = 12


def _rows_touched(shares: np.ndarray, accesses: np.ndarray) -> np.ndarray:
    """Distinct rows a batch touches, per table: ``accesses * sum_k share_k / mid_k``."""
    return accesses * np.sum(shares / BIN_MID, axis=-1)


def _make_feasible(shares: np.ndarray, accesses: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Shift each table's access share towards hotter bins (weights ``exp(a k)``, ``a`` by
    bisection) until a batch touches at most ``_MAX_TOUCHED_SHARE`` of its rows."""
    limit = _MAX_TOUCHED_SHARE * rows
    k = np.arange(NUM_REUSE_BINS)

    def shifted(a: np.ndarray) -> np.ndarray:
        out = shares * np.exp(a[:, None] * k)
        return out / out.sum(axis=1, keepdims=True)

    lo, hi = np.zeros(len(shares)), np.full(len(shares), 8.0)
    hi[_rows_touched(shares, accesses) <= limit] = 0.0
    for _ in range(40):
        mid = (lo + hi) / 2
        ok = _rows_touched(shifted(mid), accesses) <= limit
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
    return shifted(hi)


def _draw_pool_shapes(num_tables: int, rng: np.random.Generator) -> list[dict]:
    dims = np.array([4, 8, 16, 32, 64, 128, 256])
    dim_p = np.array([0.05, 0.12, 0.2, 0.22, 0.21, 0.12, 0.08])
    return [
        {
            "raw_rows": 10 ** rng.uniform(3.0, math.log10(5e6)),
            "dim": int(rng.choice(dims, p=dim_p)),
            "pooling": round(float(np.clip(np.exp(rng.normal(2.08, 1.1)), 1.0, 100.0)), 3),
            "concentration": float(np.exp(rng.normal(math.log(20.0), 0.5))),
        }
        for _ in range(num_tables)
    ]


def _pool_shares(shapes: list[dict], base: np.ndarray, seed: int) -> np.ndarray:
    """``[tables, 17]`` access shares: Dirichlet draws around ``base``, made feasible."""
    rng = np.random.default_rng([seed, 1])
    shares = np.stack([rng.dirichlet(base * s["concentration"] + 1e-3) for s in shapes])
    accesses = np.array([s["pooling"] * DLRM_BATCH_SIZE for s in shapes])
    rows = np.array([round(s["raw_rows"]) for s in shapes], dtype=np.float64)
    return _make_feasible(shares, accesses, rows)


def synthetic_pool(
    num_tables: int = DLRM_NUM_TABLES, scale: float = 1.0, seed: int = 0
) -> list[TableSpec]:
    """Tables shaped like Meta's open DLRM embedding dataset, a pure function of the
    arguments: rows log-uniform in 1e3..5e6 times ``scale`` (``CPU_POOL_SCALE`` for CPU
    work), dims 4..256, pooling log-normal around 8 in [1, 100], reuse drawn around a base
    calibrated to reproduce the published access share."""
    return list(_synthetic_pool(num_tables, float(scale), seed))


@functools.lru_cache(maxsize=8)
def _synthetic_pool(num_tables: int, scale: float, seed: int) -> tuple[TableSpec, ...]:
    if num_tables < 1:
        raise ValueError(f"num_tables must be >= 1, got {num_tables}")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    rng = np.random.default_rng(seed)
    shapes = _draw_pool_shapes(num_tables, rng)
    target = fold_published_share(DLRM_PUBLISHED_ACCESS_SHARE)
    target = target / target.sum()
    weights = np.array([s["pooling"] for s in shapes])
    base = target.copy()
    for _ in range(_CALIBRATION_ROUNDS):
        shares = _pool_shares(shapes, base, seed)
        pooled = weights @ shares
        pooled /= pooled.sum()
        base = base * np.sqrt(np.clip(target / np.maximum(pooled, 1e-9), 0.1, 10.0))
        base /= base.sum()
    shares = _pool_shares(shapes, base, seed)
    return tuple(
        TableSpec(
            name=f"dlrm_{i:03d}",
            rows=max(16, int(round(s["raw_rows"] * scale))),
            dim=s["dim"],
            pooling_factor=s["pooling"],
            reuse_hist=tuple(float(x) for x in access_share_to_row_hist(share)),
        )
        for i, (s, share) in enumerate(zip(shapes, shares, strict=True))
    )


def pool_access_share(tables: Sequence[TableSpec], batch_size: int) -> np.ndarray:
    """The pool's 17-bin share of accesses, weighted by each table's accesses per batch."""
    acc = np.zeros(NUM_REUSE_BINS)
    for t in tables:
        acc += row_hist_to_access_share(t.hist(batch_size)) * t.pooling_factor * batch_size
    return acc / acc.sum()


def pool_rows_accessed_once(tables: Sequence[TableSpec], batch_size: int) -> float:
    """Fraction of all accessed rows (over the pool) that are accessed once per batch."""
    once = total = 0.0
    for t in tables:
        hist = t.hist(batch_size)
        rows_accessed = t.pooling_factor * batch_size / float(np.sum(hist * BIN_MID))
        once += hist[0] * rows_accessed
        total += rows_accessed
    return once / total
