"""Intervals for step times measured in rounds: a plan's median step, and the per-round
ratio of two plans, with the distribution-free order-statistic interval of a median."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

LEVEL = 0.95  # the coverage asked of every interval


@dataclass(frozen=True)
class Interval:
    """A median with its order-statistic interval ``[low, high]``.

    Attributes:
        coverage: the probability that ``[low, high]`` holds the true median.
        n: how many values.
    """

    median: float
    low: float
    high: float
    coverage: float
    n: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def median_coverage(n: int, k: int) -> float:
    """Coverage of ``[x(k), x(n+1-k)]`` for the median of ``n`` values."""
    if not 1 <= k <= (n + 1) // 2:
        raise ValueError(f"k must be in 1..{(n + 1) // 2} for n={n}, got {k}")
    tail = sum(math.comb(n, j) for j in range(k)) / 2**n
    return 1.0 - 2.0 * tail


def median_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """The median of ``values`` and its interval ``[x(k), x(n+1-k)]``, ``k`` the largest
    reaching ``level`` (else ``[min, max]`` with its lower coverage)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = x.size
    if n == 0:
        raise ValueError("no values to summarise")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"values must be finite, got {values!r}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    k = 1
    while k + 1 <= (n + 1) // 2 and median_coverage(n, k + 1) >= level:
        k += 1
    return Interval(
        median=float(np.median(x)),
        low=float(x[k - 1]),
        high=float(x[n - k]),
        coverage=median_coverage(n, k),
        n=int(n),
    )


def ratio_interval(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Interval:
    """The per-round ratios ``a[i] / b[i]``: their median and its interval."""
    if len(a) != len(b):
        raise ValueError(f"a and b need one value per round each, got {len(a)} and {len(b)}")
    a_, b_ = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if np.any(b_ <= 0) or np.any(a_ <= 0):
        raise ValueError("step times must be positive")
    return median_interval(a_ / b_, level)


def verdict(ratio: Interval, a: str, b: str, level: float = LEVEL) -> str:
    """What the ratio ``a / b`` says: a difference only when the interval excludes 1."""
    if ratio.coverage < level:
        return f"too few rounds for a {level:.0%} interval ({ratio.n})"
    if ratio.high < 1.0:
        return f"{a} faster than {b} by {1 - ratio.median:.1%}"
    if ratio.low > 1.0:
        return f"{a} slower than {b} by {ratio.median - 1:.1%}"
    return "no difference beyond the interval"
