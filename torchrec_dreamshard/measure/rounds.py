"""Measuring plans against each other in interleaved rounds.

A machine's speed drifts (other work, frequency, caches), so plans measured one after the
other are not compared fairly. Interleaved rounds fix that: each round measures every plan
once, so a plan's figures pair up with the others' round by round (compare them by the
median over rounds of a ratio, or count the rounds one plan won). The order within a round
is rotated by one each round: over ``n`` rounds every plan takes every position once, and
two plans alternate (``AB``, ``BA``, ``AB``).

Several tasks can share the rounds (``groups``): a round visits every task, in rotated
order, and each task's plans in rotated order, so a task's rounds lie apart in time.

* :func:`measure_in_rounds`: the one loop; any ``measure(group, key)`` callable, resumable
  from the rounds already measured, with hooks after every group's round and every round
  (to save), in :func:`round_order` or another order (:func:`balanced_order`, the step
  timer's); the kernel timer and the step timer run through it too (one task's named
  placements: :func:`~torchrec_dreamshard.measure.placement_timing.measure_plans`).
"""

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
    """The order of ``n`` items in round ``r``: rotated left by ``r // 2``, reversed on odd
    rounds. Two items alternate ``AB, BA, BA, AB`` (each is first and second equally often
    in every four rounds, and follows itself equally often); three run in all six orders
    every six rounds."""
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
    """Measure every key of every group once per round, in interleaved rounds.

    Round ``r`` visits the groups in ``order`` and, within a group, its keys in ``order``
    (:func:`round_order` unless given). A group that already holds ``r + 1`` rounds in
    ``done`` is skipped in round ``r`` (a resumed run measures only what is missing).

    Args:
        groups: per group (a task), the keys of its plans (distinct; measured in this
            order in round 0).
        measure: ``measure(group index, key)``, one measurement (raise to stop).
        rounds: rounds in all, those in ``done`` included.
        done: per group, the rounds already measured (``{key: measurement}`` each).
        on_group: called as ``on_group(group index, round, results)`` after every
            group's round, e.g. to save the results so far.
        on_round: called as ``on_round(round)`` after every round that measured something.
        order: ``order(n, r)``, the order of ``n`` items in round ``r`` (a permutation of
            ``range(n)``).

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
