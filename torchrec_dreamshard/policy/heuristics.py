"""The classic placement heuristics, pure functions of a task: no cost model, no TorchRec.

:func:`proxy_greedy` sorts the tables by a proxy cost (:data:`PROXIES`: bytes; dim;
dim x pooling factor; dim x pooling factor x log10(rows)), descending, and puts each on
the device with the least proxy load that still has room (:func:`greedy_by_costs`); the
four heuristics are those greedies, by name (:data:`HEURISTICS`).

They raise :class:`InsufficientMemoryError` (a :class:`NoPlanError`, re-exported here) when
a table finds no device with room. The policy's safety net builds on them, and so does the
registry of every placer by name (:mod:`torchrec_dreamshard.evaluation.placers`), which adds
a random placement, TorchRec's planner and DreamShard's modes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import InsufficientMemoryError, Task
from torchrec_dreamshard.data.tasks import NoPlanError as NoPlanError  # re-exported

PROXIES: dict[str, Callable[[TableSpec], float]] = {
    "size": lambda t: float(t.size_bytes),
    "dim": lambda t: float(t.dim),
    "lookup": lambda t: t.dim * t.pooling_factor,
    "size_lookup": lambda t: t.dim * t.pooling_factor * math.log10(max(t.rows, 2)),
}
# the heuristics by name: each the greedy balancing of a proxy
HEURISTICS: dict[str, str] = {
    "size_greedy": "size",
    "dim_greedy": "dim",
    "lookup_greedy": "lookup",
    "size_lookup_greedy": "size_lookup",
}


def greedy_by_costs(task: Task, costs: Sequence[float]) -> list[int]:
    """Sort tables by ``costs`` descending; each goes to the least-loaded device (by the
    sum of its tables' costs) that still has room."""
    free = np.asarray(task.memory, dtype=np.int64)
    load = np.zeros(task.num_devices)
    out = [0] * len(task.tables)
    for i in sorted(range(len(task.tables)), key=lambda i: (-costs[i], i)):
        size = task.tables[i].size_bytes
        legal = np.flatnonzero(free >= size)
        if legal.size == 0:
            raise InsufficientMemoryError(_no_room(task.tables[i], free))
        d = int(legal[np.argmin(load[legal])])
        out[i] = d
        free[d] -= size
        load[d] += costs[i]
    return out


def proxy_greedy(task: Task, proxy: str, seed: int = 0) -> list[int]:
    """Greedy balancing of one of :data:`PROXIES` (``seed`` is unused)."""
    fn = PROXIES[proxy]
    return greedy_by_costs(task, [fn(t) for t in task.tables])


def _no_room(table: TableSpec, free: np.ndarray) -> str:
    return (
        f"table {table.name!r} ({table.size_bytes} bytes) fits on no device "
        f"(most free: {int(free.max())} bytes)"
    )
