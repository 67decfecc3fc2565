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

:func:`type_candidates` is the type choice's candidate list built this way, each type's
count kept by :func:`simplest_kept`, with every candidate decided once
(:func:`decided_once`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from torchrec.distributed.planner.types import ShardingOption

from torchrec_dreamshard.planner.type_choice.type_margin import TypeDecision

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


def type_candidates(
    orders: list[tuple[str, list[str]]],
    alts: dict[str, dict[str, ShardingOption]],
    rate: Callable[[dict[str, ShardingOption]], float],
    decide: Callable[[dict[str, ShardingOption]], TypeDecision | None] | None,
) -> tuple[list[tuple[float, dict[str, ShardingOption]]], dict[str, int]]:
    """The rated candidates, all-table-wise first: each type's prefix
    (:func:`simplest_kept`, or its best where ``decide`` is ``None``: all-table-wise does
    not fit, or nothing was measured) and the best of each type together; and, by type,
    the best-rated count where fewer tables were kept."""
    base = rate({})
    rated: list[tuple[float, dict[str, ShardingOption]]] = [(base, {})]
    fewest_of: dict[str, int] = {}
    for kind, order in orders:
        moves = [{f: alts[f][kind] for f in order[:k]} for k in range(len(order) + 1)]
        seen = rate_prefixes(lambda k, moves=moves: rate(moves[k]), len(order))
        best = best_prefix(seen)
        k = best if decide is None else simplest_kept(seen, moves, decide)
        if k != best:
            fewest_of[kind] = best
        rated.append((seen[k], moves[k]))
    winners = [m for step, m in rated[1:] if step < base]
    if len(winners) > 1:  # the best of each type together (the first type keeps a table)
        union = {k: v for m in reversed(winners) for k, v in m.items()}
        rated.append((rate(union), union))
    return rated, fewest_of


def decided_once(
    decide: Callable[[dict[str, ShardingOption]], TypeDecision | None],
) -> Callable[[dict[str, ShardingOption]], TypeDecision | None]:
    """``decide``, each candidate (its moved tables and their types) rated exactly once:
    the count's choice decides the best and the shorter prefix before the decisions are
    recorded, and each would otherwise be rated again."""
    seen: dict[frozenset, TypeDecision | None] = {}

    def once(moved: dict[str, ShardingOption]) -> TypeDecision | None:
        key = frozenset((fqn, o.sharding_type) for fqn, o in moved.items())
        if key not in seen:
            seen[key] = decide(moved)
        return seen[key]

    return once


def simplest_kept(
    seen: dict[int, float],
    moves: list[dict[str, ShardingOption]],
    decide: Callable[[dict[str, ShardingOption]], TypeDecision | None],
) -> int:
    """The prefix length a type keeps of its rated ``seen``: the fewest tables of the
    coarse grid within the best's margin, or within
    :data:`PREFIX_TOLERANCE` of its gain where that is more
    (:func:`simplest_within`), where the best clears its margin and so
    does the shorter prefix; else the best."""
    best = best_prefix(seen)
    decision = decide(moves[best])
    if decision is None or not decision.kept:
        return best
    within = max(decision.margin_ms, PREFIX_TOLERANCE * decision.gain_ms)
    k = simplest_within(seen, len(moves) - 1, within)
    shorter = decide(moves[k]) if k != best else decision
    return k if shorter is not None and shorter.kept else best
