"""The classic placement heuristics: the greedy balancing of a cost proxy, with no cost
model and no TorchRec."""

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
    """Tables by ``costs`` descending, each to the least-loaded device with room."""
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
