"""Embedding tables: specs, reuse histograms (the fraction of accessed rows whose access
count per batch falls in each of 17 power-of-two bins ``(0,1], (1,2], ..., (2^15, inf)``)
and the feature vector the networks see."""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

NUM_REUSE_BINS = 17
HIST_TOLERANCE = 1e-3
MAX_BAG_LENGTH_CV = 10.0  # std / mean of ids per sample, bursty bags
# dim, rows, pooling factor, size, then the 17 reuse bins.
FEATURE_DIM = 4 + NUM_REUSE_BINS
FEATURE_NAMES = ("log2_dim", "log10_rows", "log10_pooling", "log10_bytes") + tuple(
    f"reuse_bin_{k}" for k in range(NUM_REUSE_BINS)
)
# Fixed scales of the feature normalisation (never fitted to a task or a data set).
DIM_LOG2_SCALE = 8.0  # dim 256 -> 1.0
ROWS_LOG10_SCALE = 8.0  # 1e8 rows -> 1.0
POOLING_LOG10_SCALE = 2.0  # pooling factor 100 -> ~1.0
BYTES_LOG10_SCALE = 11.0  # 100 GB -> 1.0
FEATURE_SCALES: dict[str, float] = {  # what a checkpoint records of the normalisation
    "dim_log2": DIM_LOG2_SCALE,
    "rows_log10": ROWS_LOG10_SCALE,
    "pooling_log10": POOLING_LOG10_SCALE,
    "bytes_log10": BYTES_LOG10_SCALE,
}

# Upper bounds of a table's fields (beyond them, a clear error rather than a NaN plan).
MAX_ROWS = 2**40  # rows (about 1.1e12)
MAX_DIM = 2**16  # embedding dim
MAX_POOLING_FACTOR = 1e6  # mean ids per sample
MAX_NAME_LENGTH = 256  # characters of a table name


def reuse_bin(counts: np.ndarray) -> np.ndarray:
    """Bin index of each access count: 1 -> 0, 2 -> 1, 3..4 -> 2, ..., > 2^15 -> 16."""
    counts = np.asarray(counts, dtype=np.float64)
    if np.any(counts < 1):
        raise ValueError("access counts must be >= 1")
    return np.minimum(np.ceil(np.log2(counts)).astype(np.int64), NUM_REUSE_BINS - 1)


def bin_count_range(k: int) -> tuple[int, int]:
    """Inclusive range of access counts in bin ``k`` (the last capped at 2^16)."""
    if not 0 <= k < NUM_REUSE_BINS:
        raise ValueError(f"reuse bin {k} out of range 0..{NUM_REUSE_BINS - 1}")
    if k == 0:
        return 1, 1
    return 2 ** (k - 1) + 1, 2**k


# Inclusive count range of each bin, and its middle (a row's mean count within the bin).
BIN_LOW = np.array([bin_count_range(k)[0] for k in range(NUM_REUSE_BINS)])
BIN_HIGH = np.array([bin_count_range(k)[1] for k in range(NUM_REUSE_BINS)])
BIN_MID = (BIN_LOW + BIN_HIGH) / 2.0


@dataclass(frozen=True, kw_only=True)
class TableSpec:
    """One embedding table as the planner sees it.

    Attributes:
        pooling_factor: mean number of ids per sample (finite, > 0).
        reuse_hist: 17 fractions (summing to 1) of accessed rows by access count per
            batch; ``None``: uniform access.
        bytes_per_element: 4 for fp32 weights, 2 for fp16.
        bag_length_cv: coefficient of variation of each sample's gamma share of the ids
            (gamma-Poisson bag lengths); ``None``: ids dealt uniformly at random.
    """

    name: str
    rows: int
    dim: int
    pooling_factor: float
    reuse_hist: tuple[float, ...] | None = None
    bytes_per_element: int = 4
    bag_length_cv: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"table name must be a non-empty string, got {short_repr(self.name)}")
        if len(self.name) > MAX_NAME_LENGTH:
            raise ValueError(
                f"table name {self.name[:40]!r}... is longer than {MAX_NAME_LENGTH} characters"
            )
        where = f"table {self.name!r}"
        for fname, high in (("rows", MAX_ROWS), ("dim", MAX_DIM)):
            value = getattr(self, fname)
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise ValueError(f"{where}: {fname} must be an integer, got {short_repr(value)}")
            if not 1 <= value <= high:
                raise ValueError(f"{where}: {fname} must be in 1..{high}, got {short_repr(value)}")
            object.__setattr__(self, fname, int(value))
        pf = self.pooling_factor
        if isinstance(pf, bool) or not isinstance(pf, int | float | np.number):
            raise ValueError(f"{where}: pooling_factor must be a number, got {short_repr(pf)}")
        try:
            pf = float(pf)
        except OverflowError:
            pf = math.inf
        if not (math.isfinite(pf) and 0 < pf <= MAX_POOLING_FACTOR):
            raise ValueError(
                f"{where}: pooling_factor must be > 0 and <= {MAX_POOLING_FACTOR:g}, "
                f"got {short_repr(self.pooling_factor)}"
            )
        object.__setattr__(self, "pooling_factor", pf)
        bpe = self.bytes_per_element
        if isinstance(bpe, bool) or not isinstance(bpe, int | np.integer) or bpe not in (2, 4):
            raise ValueError(
                f"{where}: bytes_per_element must be the integer 4 (fp32) or 2 (fp16), "
                f"got {short_repr(bpe)}"
            )
        object.__setattr__(self, "bytes_per_element", int(bpe))
        if self.reuse_hist is not None:
            object.__setattr__(self, "reuse_hist", _check_hist(self.reuse_hist, where))
        if self.bag_length_cv is not None:
            object.__setattr__(self, "bag_length_cv", checked_cv(self.bag_length_cv, where))

    @property
    def size_bytes(self) -> int:
        """Bytes of the table's weights."""
        return self.rows * self.dim * self.bytes_per_element

    def hist(self, batch_size: int) -> np.ndarray:
        """The reuse histogram; when unknown, the one uniform access would give."""
        if self.reuse_hist is not None:
            return np.asarray(self.reuse_hist, dtype=np.float64)
        return uniform_reuse_hist(self.rows, self.pooling_factor * batch_size)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "rows": self.rows,
            "dim": self.dim,
            "pooling_factor": self.pooling_factor,
        }
        if self.reuse_hist is not None:
            out["reuse_hist"] = list(self.reuse_hist)
        if self.bytes_per_element != 4:
            out["bytes_per_element"] = self.bytes_per_element
        if self.bag_length_cv is not None:
            out["bag_length_cv"] = self.bag_length_cv
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TableSpec:
        if not isinstance(data, Mapping):
            raise ValueError(f"a table must be a JSON object, got {type(data).__name__}")
        unknown = set(data) - {f.name for f in fields(cls)}
        name = data.get("name", "<unnamed>")
        name = name if isinstance(name, str) else short_repr(name)
        if unknown:
            raise ValueError(f"table {name!r}: unknown fields {sorted(unknown)}")
        missing = {"name", "rows", "dim", "pooling_factor"} - set(data)
        if missing:
            raise ValueError(f"table {name!r}: missing fields {sorted(missing)}")
        hist = data.get("reuse_hist")
        if hist is not None and not isinstance(hist, list | tuple):
            raise ValueError(
                f"table {name!r}: reuse_hist must be a list of {NUM_REUSE_BINS} fractions, "
                f"got {short_repr(hist)}"
            )
        return cls(
            name=data["name"],
            rows=data["rows"],
            dim=data["dim"],
            pooling_factor=data["pooling_factor"],
            reuse_hist=None if hist is None else tuple(hist),
            bytes_per_element=data.get("bytes_per_element", 4),
            bag_length_cv=data.get("bag_length_cv"),
        )


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (a 5,000-digit integer stays readable)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**limit:
        return f"an integer of more than {limit} digits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def checked_cv(cv: Any, where: str) -> float:
    """``cv`` as a bag-length cv, a float; a ``ValueError`` (naming ``where``) unless a real
    number in ``[0, MAX_BAG_LENGTH_CV]``."""
    if isinstance(cv, bool) or not isinstance(cv, numbers.Real):
        raise ValueError(f"{where}: bag_length_cv must be a number, got {short_repr(cv)}")
    if not 0 <= cv <= MAX_BAG_LENGTH_CV:  # compared exactly: 10**400 is no float; NaN fails
        raise ValueError(
            f"{where}: bag_length_cv must be in [0, {MAX_BAG_LENGTH_CV}], got {short_repr(cv)}"
        )
    return float(cv)


def _check_hist(hist: Iterable[float], where: str) -> tuple[float, ...]:
    try:
        items = tuple(hist)
    except TypeError:
        raise ValueError(f"{where}: reuse_hist must be {NUM_REUSE_BINS} numbers") from None
    for x in items:
        if isinstance(x, bool) or not isinstance(x, int | float | np.number):
            raise ValueError(
                f"{where}: reuse_hist must hold numbers (fractions), got {short_repr(x)}"
            )
    try:
        values = tuple(float(x) for x in items)
    except OverflowError:
        raise ValueError(f"{where}: reuse_hist fractions must be finite and >= 0") from None
    if len(values) != NUM_REUSE_BINS:
        raise ValueError(
            f"{where}: reuse_hist must have {NUM_REUSE_BINS} fractions, got {len(values)}"
        )
    if any(not math.isfinite(x) or x < 0 for x in values):
        raise ValueError(f"{where}: reuse_hist fractions must be finite and >= 0")
    total = sum(values)
    if abs(total - 1.0) > HIST_TOLERANCE:
        raise ValueError(
            f"{where}: reuse_hist must sum to 1 (within {HIST_TOLERANCE}), sums to {total:.6f}"
        )
    return tuple(x / total for x in values)


def uniform_reuse_hist(rows: int, accesses: float) -> np.ndarray:
    """Expected reuse histogram of ``accesses`` uniform ids over ``rows`` rows (Poisson
    counts; cached)."""
    return np.array(_uniform_reuse_hist(int(rows), float(accesses)))


@functools.lru_cache(maxsize=65536)
def _uniform_reuse_hist(rows: int, accesses: float) -> tuple[float, ...]:
    lam = max(float(accesses), 1e-9) / rows
    hist = np.zeros(NUM_REUSE_BINS)
    # Sum the Poisson pmf over each bin's integer range, in log space for large lambda.
    upper = int(max(lam + 12 * math.sqrt(lam) + 20, 2))
    ks = np.arange(1, min(upper, 2**16) + 1)
    logpmf = ks * math.log(lam) - lam - _log_factorials(len(ks))
    pmf = np.exp(logpmf)
    np.add.at(hist, reuse_bin(ks), pmf)
    if hist.sum() <= 0:  # every row read far more (or far less) often than the pmf reaches
        hist[NUM_REUSE_BINS - 1 if lam > 1 else 0] = 1.0
    return tuple((hist / hist.sum()).tolist())


_LOG_FACTORIALS: list[float] = [0.0]  # math.lgamma(k + 1) = log k!, for k = 0, 1, ...


def _log_factorials(n: int) -> np.ndarray:
    """``[log 1!, ..., log n!]``, computed once per process."""
    while len(_LOG_FACTORIALS) <= n:
        _LOG_FACTORIALS.append(math.lgamma(len(_LOG_FACTORIALS) + 1))
    return np.array(_LOG_FACTORIALS[1 : n + 1])


def table_features(tables: Sequence[TableSpec], batch_size: int = 2048) -> np.ndarray:
    """Feature matrix ``[len(tables), FEATURE_DIM]`` (float32) scaled by fixed constants:
    log dim, rows, pooling and bytes, then the 17 reuse fractions (uniform access's at
    ``batch_size`` for a table without statistics)."""
    out = np.zeros((len(tables), FEATURE_DIM), dtype=np.float32)
    for i, t in enumerate(tables):
        out[i, 0] = math.log2(t.dim) / DIM_LOG2_SCALE
        out[i, 1] = math.log10(t.rows) / ROWS_LOG10_SCALE
        out[i, 2] = math.log10(1.0 + t.pooling_factor) / POOLING_LOG10_SCALE
        out[i, 3] = math.log10(t.size_bytes) / BYTES_LOG10_SCALE
        out[i, 4:] = t.hist(batch_size)
    return out
