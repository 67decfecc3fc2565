"""How many tables a sharding type takes (planner/type_choice/type_prefixes.py and the type choice's
use of it): a count the cost model cannot tell from the best goes to the fewest tables of a
grid that does not depend on the ratings, so that noisy inputs keep the same count."""

from __future__ import annotations

import pytest

from torchrec_dreamshard.planner.type_choice.type_margin import TypeDecision
from torchrec_dreamshard.planner.type_choice.type_prefixes import (
    PREFIX_TOLERANCE,
    coarse_sizes,
    rate_prefixes,
    simplest_kept,
    simplest_within,
)


def flat_curve(best: int, jitter: float):
    """Ratings that fall steeply to a flat bottom around ``best`` (ms), with ``jitter``."""

    def rate(k: int) -> float:
        return 6.0 - 2.0 * min(k, 64) / 64 + 0.01 * max(0, k - 90) + jitter * ((k * 7) % 3 - 1)

    return rate


def test_coarse_sizes_do_not_depend_on_the_ratings():
    assert coarse_sizes(100) == [1, 4, 16, 64, 100]
    assert coarse_sizes(4) == [1, 4]
    assert coarse_sizes(0) == []


@pytest.mark.parametrize("jitter", [0.0, 0.02, 0.04])
def test_the_flat_bottom_moves_the_best_but_not_the_simplest_count(jitter):
    """The lowest rating lands anywhere on the flat bottom as the jitter moves it; the
    fewest coarse tables within the margin is the same count every time."""
    seen = rate_prefixes(flat_curve(80, jitter), 100)
    assert simplest_within(seen, 100, 0.2) == 64


def test_a_count_clearly_behind_is_never_the_simplest():
    seen = {1: 5.9, 4: 5.5, 16: 4.5, 64: 4.0, 100: 3.0}
    assert simplest_within(seen, 100, 0.2) == 100
    with pytest.raises(ValueError, match="margin_ms"):
        simplest_within(seen, 100, float("nan"))


def decision(tables: int, gain: float, margin: float) -> TypeDecision:
    return TypeDecision("data_parallel", tables, gain, margin / 2, margin, gain > margin)


def test_fewer_tables_only_where_the_best_and_the_shorter_prefix_clear_their_margins():
    seen = {1: 5.9, 4: 5.7, 16: 5.0, 64: 4.05, 80: 4.0, 100: 4.3}
    moves = [dict.fromkeys(range(k)) for k in range(101)]
    gains = {k: 6.0 - v for k, v in seen.items()}

    def decide(m):
        return decision(len(m), gains[len(m)], 0.1)

    # within the best's margin (0.1 ms) 64 tables are not told from 80: the simpler
    assert simplest_kept(seen, moves, decide) == 64

    # a best that does not clear its margin keeps its count (the type is declined anyway)
    def unsure(m):
        return decision(len(m), gains[len(m)], 5.0)

    assert simplest_kept(seen, moves, unsure) == 80

    # the share of the gain widens a margin smaller than the inputs' noise
    tight = {**seen, 64: 4.0 + 0.9 * PREFIX_TOLERANCE * gains[80]}
    gains[64] = 6.0 - tight[64]

    def small(m):
        return decision(len(m), gains[len(m)], 0.01)

    assert simplest_kept(tight, moves, small) == 64


def test_the_simplest_count_never_moves_more_tables_than_the_best():
    """All the tables rated within the margin of a best of fewer is not the simpler plan:
    the best is kept."""
    seen = {1: 5.9, 4: 5.5, 16: 4.9, 64: 4.6, 82: 4.0, 100: 4.1}
    assert simplest_within(seen, 100, 0.2) == 82
