"""Measuring plans against each other in interleaved rounds (every plan once a round, in an
order rotated from round to round), so a drift of the machine's speed hits them alike."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")


def round_order(n: int, r: int) -> list[int]:
    """The order of ``n`` items in round ``r``: ``0..n-1`` rotated left by ``r``."""
    k = r % n if n else 0
    return [*range(k, n), *range(k)]


def balanced_order(n: int, r: int) -> list[int]:
    """``n`` items rotated left by ``r // 2``, reversed on odd rounds (two alternate ``AB, BA,
    BA, AB``; three run in all six orders every six rounds)."""
    rotated = round_order(n, r // 2)
    return rotated[::-1] if r % 2 else rotated


def measure_in_rounds(
    groups: Sequence[Sequence[K]],
    measure: Callable[[int, K], R],
    rounds: int,
    *,
    done: Sequence[Sequence[Mapping[K, R]]] | None = None,
    on_group: Callable[[int, int, dict[K, R]], None] | None = None,
    on_round: Callable[[int], None] | None = None,
    order: Callable[[int, int], list[int]] = round_order,
) -> list[list[dict[K, R]]]:
    """Measure every key of every group once per round; round ``r`` visits the groups, and
    each group's keys, in ``order(n, r)``. A group holding ``r + 1`` rounds in ``done`` is
    skipped in round ``r``, so a resumed run measures only what is missing.

    Args:
        groups: per group (a task), its distinct plan keys.
        measure: ``measure(group index, key)``, one measurement (raise to stop).
        rounds: rounds in all, those in ``done`` included.
        done: per group, the rounds already measured (``{key: measurement}`` each).
        on_group: ``on_group(group index, round, results)`` after every group's round.
        on_round: ``on_round(round)`` after every round that measured something.
        order: ``order(n, r)``, a permutation of ``range(n)``.

    Returns:
        Per group, its rounds (``done``'s first), each ``{key: measurement}``.
    """
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    for g, keys in enumerate(groups):
        if len(set(keys)) != len(keys):
            raise ValueError(f"group {g} repeats a plan key: {list(keys)}")
    done = done if done is not None else [[] for _ in groups]
    if len(done) != len(groups):
        raise ValueError(f"done holds {len(done)} groups' rounds for {len(groups)} groups")
    out = [[dict(res) for res in rs] for rs in done]
    for r in range(rounds):
        todo = [g for g in order(len(groups), r) if len(out[g]) <= r]
        for g in todo:
            keys = groups[g]
            results = {keys[i]: measure(g, keys[i]) for i in order(len(keys), r)}
            out[g].append(results)
            if on_group is not None:
                on_group(g, r, results)
        if todo and on_round is not None:
            on_round(r)
    return out
