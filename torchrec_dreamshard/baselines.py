"""Baseline placers, all behind one interface: a task in, a device per table out, every
device's memory respected.

* ``random``: each table (largest first) on a uniformly random device with room;
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

Use :func:`place` (``place("size_lookup_greedy", task)``) or the functions directly.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from torchrec_dreamshard import tasks
from torchrec_dreamshard.tables import TableSpec
from torchrec_dreamshard.tasks import Task, check_placement, device_tables

Placer = Callable[..., list[int]]


class NoPlanError(ValueError):
    """A baseline found no placement that fits (e.g. TorchRec's planner with its default
    storage reservation on tight memory)."""


# ----------------------------------------------------------------------------------------
# Random and greedy
# ----------------------------------------------------------------------------------------


def random_placement(task: Task, seed: int = 0) -> list[int]:
    """:func:`torchrec_dreamshard.tasks.random_placement`, raising :class:`NoPlanError`
    when a table fits on no device."""
    try:
        return tasks.random_placement(task, seed)
    except ValueError as exc:
        raise NoPlanError(str(exc)) from None


PROXIES: dict[str, Callable[[TableSpec], float]] = {
    "size": lambda t: float(t.size_bytes),
    "dim": lambda t: float(t.dim),
    "lookup": lambda t: t.dim * t.pooling_factor,
    "size_lookup": lambda t: t.dim * t.pooling_factor * math.log10(max(t.rows, 2)),
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
            raise NoPlanError(_no_room(task.tables[i], free))
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


# ----------------------------------------------------------------------------------------
# TorchRec's planner
# ----------------------------------------------------------------------------------------


def torchrec_placement(task: Task, seed: int = 0, ours: bool = False) -> list[int]:
    """TorchRec's ``EmbeddingShardingPlanner``, table-wise fused sharding only.

    Args:
        task: the task (its batch is the global batch; TorchRec gets ``B / D`` per rank).
        seed: unused (the planner is deterministic).
        ours: use our memory accounting (weights' bytes only, no reservation) instead of
            TorchRec's defaults.

    Raises:
        NoPlanError: TorchRec's planner found no plan (its message is kept).
    """
    import torch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.storage_reservations import (
        FixedPercentageStorageReservation,
    )
    from torchrec.distributed.planner.types import ParameterConstraints, PlannerError
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    configs = [
        EmbeddingBagConfig(
            name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[f"f{i}"]
        )
        for i, t in enumerate(task.tables)
    ]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    constraints = {
        t.name: ParameterConstraints(
            sharding_types=["table_wise"],
            compute_kernels=["fused"],
            pooling_factors=[t.pooling_factor],
        )
        for t in task.tables
    }
    with _quiet_torchrec():
        topology = Topology(
            world_size=task.num_devices, compute_device="cpu", ddr_cap=max(task.memory)
        )
    for dev, cap in zip(topology.devices, task.memory, strict=True):
        dev.storage.ddr = int(cap)
    kwargs = {}
    if ours:
        kwargs["enumerator"] = _weights_only_enumerator(topology, task, constraints)
        kwargs["storage_reservation"] = FixedPercentageStorageReservation(0.0)
    try:
        with _quiet_torchrec():
            planner = EmbeddingShardingPlanner(
                topology=topology,
                batch_size=max(1, task.batch_size // task.num_devices),
                constraints=constraints,
                debug=False,
                **kwargs,
            )
            plan = planner.plan(ebc, [EmbeddingBagCollectionSharder()])
    except PlannerError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NoPlanError(f"TorchRec's planner found no plan: {first}") from None
    return _ranks_from_plan(task, plan)


@contextlib.contextmanager
def _quiet_torchrec() -> Iterator[None]:
    """Silence TorchRec's planner warnings about dry-run topologies while planning."""
    logger = logging.getLogger("torchrec.distributed.planner")
    before = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(before)


def _weights_only_enumerator(topology, task: Task, constraints):
    """TorchRec's enumerator with each shard's storage set to the table's bytes."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.types import Storage

    sizes = {t.name: t.size_bytes for t in task.tables}

    class WeightsOnlyEnumerator(EmbeddingEnumerator):
        def enumerate(self, module, sharders):
            options = super().enumerate(module, sharders)
            for option in options:
                for shard in option.shards:
                    shard.storage = Storage(hbm=0, ddr=sizes[option.name])
            return options

    return WeightsOnlyEnumerator(topology, batch_size=task.batch_size, constraints=constraints)


def _ranks_from_plan(task: Task, plan) -> list[int]:
    ranks: dict[str, int] = {}
    for module_plan in plan.plan.values():
        for name, param in module_plan.items():
            shards = param.sharding_spec.shards
            ranks[name] = int(shards[0].placement.rank())
    missing = [t.name for t in task.tables if t.name not in ranks]
    if missing:
        raise NoPlanError(f"TorchRec's plan has no rank for tables {missing}")
    return check_placement(task, [ranks[t.name] for t in task.tables])


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


# ----------------------------------------------------------------------------------------
# Measured local search (the headroom reference)
# ----------------------------------------------------------------------------------------


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
    """A move or swap off the bottleneck device (``None`` when nothing is possible)."""
    groups = device_tables(task, placement)
    order = np.argsort(dev_ms)
    b = int(order[-1])
    free = np.asarray(task.memory) - np.array(
        [sum(task.tables[i].size_bytes for i in g) for g in groups]
    )
    for _ in range(20):
        i = int(rng.choice(groups[b]))
        d = int(rng.choice(order[: max(1, len(order) // 2)]))
        if d == b:
            continue
        cand = list(placement)
        if rng.random() < 0.5 and free[d] >= task.tables[i].size_bytes:
            cand[i] = d
            return cand
        if groups[d]:
            j = int(rng.choice(groups[d]))
            cand[i], cand[j] = d, b
            try:
                return check_placement(task, cand)
            except ValueError:
                continue
    return None
