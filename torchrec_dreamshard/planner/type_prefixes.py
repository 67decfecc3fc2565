"""How many tables a sharding type takes: the prefix of its order the type choice keeps.

Each alternative type orders the tables that may take it (its strategy's
``candidate_key``) and moves a prefix of that order off table-wise. The ratings of the
prefixes rise steeply from one table to the best count and then lie flat around it, where
they move by hundredths of a millisecond with the greedy balance of the rest: the count the
lowest rating picks there moves with every measurement of the machine. So:

* :func:`rate_prefixes` sweeps a fixed coarse grid (:func:`coarse_sizes`: 1, 4, 16, ...
  tables and all of them), then halves the gaps on either side of the best;
* where the collectives' models were fitted to this machine's timings,
  :func:`simplest_within` keeps the fewest tables of the coarse grid whose rating lies
  within the decision's margin of the best, or within :data:`PREFIX_TOLERANCE` of its
  gain over all-table-wise where that is more: a count the cost model cannot tell from
  the best goes to the plan nearer all-table-wise, the simpler one, every time. The grid
  does not depend on the ratings, and its steps are steep where the ratings are, so the same
  inputs measured again keep the same count (``benchmarks/type_stability.py``). Models that
  were given (a user's, analytic ones) do not move between plans: the best count is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

PREFIX_GROWTH = 4  # each coarse candidate of a type moves this many times the tables of the last
# counts whose gain over all-table-wise lies within this share of the best's gain are not
# told apart, even where the decision's own margin is smaller: the machine's measured inputs
# (the collective fits, the kernels' calibration) move the flat part of the ratings by about
# this much of the gain from one cold measurement to the next, and the gain itself by more
# (a 100-table model's best count moved between 70 and 86 tables, 64 tables rated 5-20% of
# the gain behind it, and the gain was 1.1-4.3 ms: benchmarks/results/type_stability_*.json);
# it is the error the margin already takes for a kernel network not calibrated here
# (type_margin.KERNEL_ERROR), the part of the gain that moves most
PREFIX_TOLERANCE = 0.25


def coarse_sizes(n: int) -> list[int]:
    """1, 4, 16, ... tables, and all ``n``."""
    sizes, k = [], 1
    while k < n:
        sizes.append(k)
        k *= PREFIX_GROWTH
    return sizes + [n] if n else []


def rate_prefixes(rate: Callable[[int], float], n: int) -> dict[int, float]:
    """The rating of every prefix length tried, by length: :func:`coarse_sizes`, then
    halving the gaps on either side of the best until none is left."""
    seen = {k: rate(k) for k in coarse_sizes(n)}
    while True:
        best = best_prefix(seen)
        lower = max((k for k in seen if k < best), default=0)
        upper = min((k for k in seen if k > best), default=best)
        trial = [k for k in ((lower + best) // 2, (best + upper) // 2) if k > 0 and k not in seen]
        if not trial:
            return seen
        seen.update({k: rate(k) for k in trial})


def best_prefix(seen: Mapping[int, float]) -> int:
    """The lowest-rated prefix length (the shorter of equals)."""
    return min(seen, key=lambda k: (seen[k], k))


def simplest_within(seen: Mapping[int, float], n: int, margin_ms: float) -> int:
    """The shortest prefix of :func:`coarse_sizes`, no longer than the best of ``seen``,
    rated within ``margin_ms`` of it (the best itself where none is).

    Raises:
        ValueError: ``margin_ms`` is negative or not a number.
    """
    if not margin_ms >= 0:
        raise ValueError(f"margin_ms must be a number >= 0, got {margin_ms!r}")
    best = best_prefix(seen)
    limit = seen[best] + margin_ms
    close = [k for k in coarse_sizes(n) if k <= best and k in seen and seen[k] <= limit]
    return min(close, default=best)
