"""How many tables a sharding type takes: the prefix of its order the type choice keeps.

:func:`rate_prefixes` sweeps a coarse grid (1, 4, 16, ... and all), then halves the gaps
beside the best. Where the collectives were fitted on this machine, :func:`simplest_within`
keeps the fewest tables of the grid rated within the margin of the best: ratings are flat
near the best, so a count the model cannot tell apart goes to the simpler plan, and a
machine measured again keeps the same count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from torchrec.distributed.planner.types import ShardingOption

from torchrec_dreamshard.planner.type_choice.type_margin import TypeDecision

PREFIX_GROWTH = 4  # each coarse candidate of a type moves this many times the tables of the last
# counts whose gain lies within this share of the best's are not told apart: a cold
# re-measurement of the machine moves the flat part of the ratings by about this much
# (type_margin.KERNEL_ERROR, the error of a kernel network not calibrated here)
PREFIX_TOLERANCE = 0.25


def coarse_sizes(n: int) -> list[int]:
    """1, 4, 16, ... tables, and all ``n``."""
    sizes, k = [], 1
    while k < n:
        sizes.append(k)
        k *= PREFIX_GROWTH
    return sizes + [n] if n else []


def rate_prefixes(rate: Callable[[int], float], n: int) -> dict[int, float]:
    """The rating of every prefix length tried: the coarse grid, then halving beside the best."""
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
    """The shortest prefix of the coarse grid, no longer than the best of ``seen``, rated
    within ``margin_ms`` of it.

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
    """The rated candidates, all-table-wise first: each type's kept prefix and the best of each
    together; and, by type, the best-rated count where fewer were kept."""
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
    """``decide``, each candidate rated exactly once."""
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
    """The prefix length a type keeps of ``seen`` (:func:`simplest_within` where both clear)."""
    best = best_prefix(seen)
    decision = decide(moves[best])
    if decision is None or not decision.kept:
        return best
    within = max(decision.margin_ms, PREFIX_TOLERANCE * decision.gain_ms)
    k = simplest_within(seen, len(moves) - 1, within)
    shorter = decide(moves[k]) if k != best else decision
    return k if shorter is not None and shorter.kept else best
