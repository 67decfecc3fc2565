"""Baseline placers, all behind one interface: a task in, a device per table out, every
device's memory respected.

* ``random``: each table (largest first) on a uniformly random device with room
  (:func:`torchrec_dreamshard.data.tasks.random_placement`);
* ``size_greedy``, ``dim_greedy``, ``lookup_greedy``, ``size_lookup_greedy``: sort the
  tables by a proxy cost, descending, and put each on the device with the least proxy
  load that still has room. Proxies: bytes; dim; dim x pooling factor; dim x pooling
  factor x log10(rows);
* ``torchrec``: TorchRec's own ``EmbeddingShardingPlanner`` restricted to table-wise fused
  sharding, given the pooling factors, the batch size and the memory in its ``Topology``,
  with its default storage reservation (15% heuristic) and storage estimate (optimizer
  state, I/O buffers): it finds no plan at all when memory is tight;
* ``torchrec_ours``: the same planner with our memory accounting (a table costs its
  weights' bytes, nothing is reserved), so it always competes;
* :func:`measured_search`: the expensive headroom reference, a local search that moves
  and swaps tables off the measured bottleneck device and keeps a change only when the
  measured step cost drops.

Use :func:`place` (``place("size_lookup_greedy", task)``) or the functions directly. The
heuristics live in :mod:`torchrec_dreamshard.policy.heuristics` (free of TorchRec, for the policy's
safety net) and :func:`measured_search` in :mod:`torchrec_dreamshard.planner.measured_search`; both
are re-exported here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from torchrec_dreamshard.data.tasks import NoPlanError, Task, check_placement, random_placement
from torchrec_dreamshard.planner.measured_search import MeasureFn, SearchResult, measured_search
from torchrec_dreamshard.policy.heuristics import PROXIES, greedy_by_costs, proxy_greedy

Placer = Callable[..., list[int]]


# ----------------------------------------------------------------------------------------
# TorchRec's planner
# ----------------------------------------------------------------------------------------


def torchrec_placement(task: Task, seed: int = 0, ours: bool = False) -> list[int]:
    """TorchRec's ``EmbeddingShardingPlanner``, table-wise fused sharding only (see
    :func:`torchrec_dreamshard.planner.torchrec_adapter.plan_with_torchrec`).

    Args:
        task: the task (its batch is the global batch; TorchRec gets ``B / D`` per rank).
        seed: unused (the planner is deterministic).
        ours: use our memory accounting (weights' bytes only, no reservation) instead of
            TorchRec's defaults.

    Raises:
        NoPlanError: TorchRec's planner found no plan (its message is kept).
    """
    from torchrec.distributed.planner.types import PlannerError

    from torchrec_dreamshard.planner.torchrec_adapter import plan_with_torchrec

    # module names may not hold dots (a planner's tables are named by their FQN): plan
    # tables named t0, t1, ... and map the ranks back by position
    renamed = Task(
        tables=[dataclasses.replace(t, name=f"t{i}") for i, t in enumerate(task.tables)],
        num_devices=task.num_devices,
        memory_bytes=list(task.memory),
        batch_size=task.batch_size,
    )
    try:
        ranks = plan_with_torchrec(renamed, weights_only=ours)
    except PlannerError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NoPlanError(f"TorchRec's planner found no plan: {first}") from None
    missing = [
        t.name for t, r in zip(task.tables, renamed.tables, strict=True) if r.name not in ranks
    ]
    if missing:
        raise NoPlanError(f"TorchRec's plan has no rank for tables {missing}")
    return check_placement(task, [ranks[t.name] for t in renamed.tables])


# ----------------------------------------------------------------------------------------
# The registry
# ----------------------------------------------------------------------------------------

BASELINES: dict[str, Placer] = {
    "random": random_placement,
    "size_greedy": lambda task, seed=0: proxy_greedy(task, "size"),
    "dim_greedy": lambda task, seed=0: proxy_greedy(task, "dim"),
    "lookup_greedy": lambda task, seed=0: proxy_greedy(task, "lookup"),
    "size_lookup_greedy": lambda task, seed=0: proxy_greedy(task, "size_lookup"),
    "torchrec": lambda task, seed=0: torchrec_placement(task),
    "torchrec_ours": lambda task, seed=0: torchrec_placement(task, ours=True),
}
HEURISTICS = ("size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy")


def place(name: str, task: Task, seed: int = 0) -> list[int]:
    """The placement of baseline ``name`` (one of :data:`BASELINES`).

    Raises:
        ValueError: an unknown name; :class:`NoPlanError` when the baseline finds no plan.
    """
    if name not in BASELINES:
        raise ValueError(f"unknown baseline {name!r}; choose from {sorted(BASELINES)}")
    return check_placement(task, BASELINES[name](task, seed=seed))


__all__ = [
    "BASELINES",
    "HEURISTICS",
    "PROXIES",
    "MeasureFn",
    "NoPlanError",
    "SearchResult",
    "greedy_by_costs",
    "measured_search",
    "place",
    "proxy_greedy",
    "random_placement",
    "torchrec_placement",
]
