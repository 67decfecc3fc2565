"""The headroom reference: a local search on real measurements that moves and swaps
tables off the measured bottleneck device and keeps a change only when the measured step
cost drops."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.policy.moves import moves


@dataclass
class SearchResult:
    """What :func:`measured_search` found.

    Attributes:
        placement: the best placement measured.
        step_ms: its measured step cost.
        measurements: measurements spent.
        history: best step cost after each measurement.
    """

    placement: list[int]
    step_ms: float
    measurements: int
    history: list[float] = field(default_factory=list)


MeasureFn = Callable[[Task, list[int]], tuple[float, list[float]]]
"""``(task, placement) -> (step_ms, per-device total ms)``."""


def measured_search(
    task: Task,
    starts: Sequence[Sequence[int]],
    measure: MeasureFn,
    budget: int = 40,
    seed: int = 0,
    min_gain: float = 0.01,
) -> SearchResult:
    """Local search on real measurements.

    Every start is measured; from the best, each step takes a table off the measured
    bottleneck device and either moves it to a lighter device with room or swaps it with
    a table there, measures the result and keeps it when the step cost drops by more than
    ``min_gain`` (relative; the measurement is noisy).

    Args:
        task: the task.
        starts: starting placements (e.g. the heuristics').
        measure: the measurement function.
        budget: measurements in all, the starts included.
        seed: proposal RNG.
        min_gain: relative improvement a change needs to be kept.
    """
    rng = np.random.default_rng(seed)
    best, best_ms, best_dev, history, used = None, math.inf, None, [], 0
    for start in starts:
        if used >= budget:
            break
        ms, dev = measure(task, list(start))
        used += 1
        if ms < best_ms:
            best, best_ms, best_dev = list(start), ms, dev
        history.append(best_ms)
    if best is None:
        raise ValueError("measured_search needs at least one start and a budget >= 1")
    while used < budget:
        cand = _propose(task, best, best_dev, rng)
        if cand is None:
            break
        ms, dev = measure(task, cand)
        used += 1
        if ms < best_ms * (1 - min_gain):
            best, best_ms, best_dev = cand, ms, dev
        history.append(best_ms)
    return SearchResult(best, best_ms, used, history)


def _propose(
    task: Task, placement: list[int], dev_ms: Sequence[float], rng: np.random.Generator
) -> list[int] | None:
    """A move or swap of a table off the measured bottleneck device with one of the lighter
    half of the devices, drawn from the refinement's legal changes
    (:func:`~torchrec_dreamshard.policy.moves.moves`: both devices stay within memory); a
    move or a swap with even odds where both exist. ``None`` when there is none."""
    order = np.argsort(dev_ms)
    b = int(order[-1])
    lighter = set(order[: max(1, len(order) // 2)].tolist()) - {b}
    sizes = np.array([t.size_bytes for t in task.tables], dtype=np.float64)
    changes = moves(
        np.asarray(placement),
        b,
        sizes,
        np.asarray(task.memory, dtype=np.float64),
        rng,
        pair_swaps=0,
        limit=sys.maxsize,  # every legal change: no draw here
    )
    changes = [c for c in changes if c[3] in lighter]
    kinds = [k for k in ([c for c in changes if c[1] < 0], [c for c in changes if c[1] >= 0]) if k]
    if not kinds:
        return None
    pool = kinds[int(rng.random() >= 0.5)] if len(kinds) == 2 else kinds[0]
    i, j, _, d = pool[int(rng.integers(len(pool)))]
    cand = list(placement)
    cand[i] = d
    if j >= 0:
        cand[j] = b
    return cand
