"""The cost of a typed plan: every table's sharding terms priced per rank, fused kernels
and collectives batched as TorchRec batches them; the step is the slowest rank's
``fwd + bwd + comm``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from torchrec_dreamshard.cost.comm_topology import all_to_all_ms, ring_ms
from torchrec_dreamshard.cost.sharding import (
    PATH_KIND,
    CostContext,
    Exchange,
    KernelFn,
    KernelsFn,
    TableChoice,
    Terms,
    job_terms,
    path_cost,
)
from torchrec_dreamshard.cost.sharding_types import table_terms
from torchrec_dreamshard.data.tables import TableSpec


@dataclass(frozen=True)
class RankCost:
    """One rank's forward, backward and communication ms in a step."""

    fwd_ms: float
    bwd_ms: float
    comm_ms: float

    @property
    def total_ms(self) -> float:
        return self.fwd_ms + self.bwd_ms + self.comm_ms


@dataclass(frozen=True)
class PlanCost:
    """Every rank's cost; the step is the slowest rank's total."""

    ranks: tuple[RankCost, ...]

    @property
    def step_ms(self) -> float:
        return max(r.total_ms for r in self.ranks)


def kernel_costs(terms: Terms, ctx: CostContext) -> tuple[np.ndarray, np.ndarray]:
    """``([W], [W])`` forward and backward ms of every fused and dense kernel."""
    groups: dict[tuple[int, str, int], list[TableSpec]] = {}
    dense: dict[tuple[int, str, int], list[TableSpec]] = {}
    for k in terms.kernels:
        (dense if k.dense else groups).setdefault((k.rank, k.group, k.batch), []).append(k.table)
    fwd, bwd = np.zeros(ctx.topology.world_size), np.zeros(ctx.topology.world_size)
    calls = [(tables, batch) for (_, _, batch), tables in groups.items()]
    if ctx.kernels_ms is not None:
        times = ctx.kernels_ms(calls)
    else:
        times = [ctx.kernel_ms(tables, batch) for tables, batch in calls]
    if dense:
        if ctx.dense_kernel is None:
            raise ValueError("dense kernel calls need ctx.dense_kernel (the fitted model)")
        times = list(times) + [ctx.dense_kernel.ms(t, batch) for (_, _, batch), t in dense.items()]
    for (rank, _, _), (f, b) in zip([*groups, *dense], times, strict=True):
        fwd[rank] += f
        bwd[rank] += b
    for rank, nbytes in terms.dense_bytes:
        bwd[rank] += nbytes / ctx.mem_bw
    return fwd, bwd


def merged_exchanges(exchanges: Iterable[Exchange]) -> list[Exchange]:
    """One exchange per collective: shares with equal ``(tag, kind, ranks)`` summed."""
    merged: dict[tuple[str, str, tuple[int, ...]], Exchange] = {}
    for e in exchanges:
        key = (e.tag, e.kind, tuple(sorted(e.ranks)))
        old = merged.get(key)
        if old is None:
            merged[key] = Exchange(e.tag, e.kind, key[2], e.flows, e.buffer_bytes)
            continue
        flows = None if e.flows is None else old.flows + e.flows
        merged[key] = Exchange(e.tag, e.kind, key[2], flows, old.buffer_bytes + e.buffer_bytes)
    return list(merged.values())


def comm_costs(terms: Terms, ctx: CostContext) -> np.ndarray:
    """``[W]`` ms of every collective each rank takes part in, batched."""
    comm = np.zeros(ctx.topology.world_size)
    for e in merged_exchanges(terms.exchanges):
        if e.kind == PATH_KIND:
            comm += path_cost(e.ranks, ctx)
        elif e.kind == "all_to_all":
            comm += all_to_all_ms(ctx.topology, ctx.collectives, e.ranks, e.flows)
        else:
            comm += ring_ms(ctx.topology, ctx.collectives, e.kind, e.ranks, e.buffer_bytes)
    return comm


def terms_cost(terms: Terms, ctx: CostContext) -> PlanCost:
    """Every rank's fwd, bwd and comm ms of ``terms``."""
    fwd, bwd = kernel_costs(terms, ctx)
    comm = comm_costs(terms, ctx)
    return PlanCost(
        tuple(
            RankCost(float(f), float(b), float(c)) for f, b, c in zip(fwd, bwd, comm, strict=True)
        )
    )


def table_cost(choice: TableChoice, ctx: CostContext) -> PlanCost:
    """What ``choice`` costs every rank alone (and the job's dense all-reduce, if any)."""
    return terms_cost(job_terms(ctx) + table_terms(choice, ctx), ctx)


def plan_terms(
    choices: Sequence[TableChoice],
    ctx: CostContext,
    terms_of: Callable[[TableChoice, CostContext], Terms] = table_terms,
) -> Terms:
    """Every choice's terms and the job's, together."""
    kernels, exchanges, dense = [], [], []
    for c in choices:  # gathered in lists: adding Terms one by one copies them each time
        terms = terms_of(c, ctx)
        kernels += terms.kernels
        exchanges += terms.exchanges
        dense += terms.dense_bytes
    return job_terms(ctx) + Terms(tuple(kernels), tuple(exchanges), tuple(dense))


def plan_cost(
    choices: Sequence[TableChoice],
    ctx: CostContext,
    terms_of: Callable[[TableChoice, CostContext], Terms] = table_terms,
) -> PlanCost:
    """What a typed plan costs every rank, collectives batched.

    Args:
        terms_of: each choice's terms (a
            :class:`~torchrec_dreamshard.cost.sharding_types.TermsCache` reuses them).
    """
    counts = Counter(c.table.name for c in choices)
    dupes = sorted(n for n, k in counts.items() if k > 1)
    if dupes:
        raise ValueError(f"tables {dupes} are chosen more than once; give each one choice")
    if not choices:
        raise ValueError("a plan needs at least one table choice")
    return terms_cost(plan_terms(choices, ctx, terms_of), ctx)


@dataclass(frozen=True)
class PlanBreakdown:
    """A typed plan's cost per rank by source: fused kernels, dense kernel, each collective."""

    fused_ms: np.ndarray
    dense_ms: np.ndarray
    comm_ms: dict[str, np.ndarray]

    @property
    def total_ms(self) -> np.ndarray:
        """``[W]`` every rank's total."""
        return (
            self.fused_ms + self.dense_ms + sum(self.comm_ms.values(), np.zeros_like(self.fused_ms))
        )

    @property
    def slowest(self) -> int:
        """The rank that sets the step."""
        return int(np.argmax(self.total_ms))

    def at_slowest(self) -> dict[str, float]:
        """The slowest rank's ms by source (``fused_kernels``, ``dense_kernel``, collectives)."""
        r = self.slowest
        out = {"fused_kernels": float(self.fused_ms[r]), "dense_kernel": float(self.dense_ms[r])}
        out.update({kind: float(ms[r]) for kind, ms in self.comm_ms.items()})
        return out


def plan_breakdown(
    choices: Sequence[TableChoice],
    ctx: CostContext,
    terms_of: Callable[[TableChoice, CostContext], Terms] = table_terms,
) -> PlanBreakdown:
    """:func:`plan_cost`'s ranks split by source (their sum is its ranks' totals)."""
    full = plan_terms(choices, ctx, terms_of)
    zeros = np.zeros(ctx.topology.world_size)
    fused = Terms(tuple(k for k in full.kernels if not k.dense))
    dense = Terms(tuple(k for k in full.kernels if k.dense), (), full.dense_bytes)
    fused_ms = sum(kernel_costs(fused, ctx)) if fused.kernels else zeros
    dense_ms = sum(kernel_costs(dense, ctx)) if dense.kernels or dense.dense_bytes else zeros
    comm: dict[str, np.ndarray] = {}
    for e in merged_exchanges(full.exchanges):
        one = Terms(exchanges=(e,))
        comm[e.kind] = comm.get(e.kind, zeros) + comm_costs(one, ctx)
    return PlanBreakdown(np.asarray(fused_ms), np.asarray(dense_ms), comm)


KERNELS_PER_PREDICTION = 1024  # kernels (devices of one task) priced in one prediction


class Predictor(Protocol):
    """What :func:`cost_network_kernel` needs of an agent."""

    def predict(self, task: Any, placement: Sequence[int]) -> Any: ...


def cost_network_kernel(agent: Predictor) -> KernelFn:
    """``kernel_ms`` from an agent's cost network: the tables alone on one device."""
    from torchrec_dreamshard.data.tasks import MAX_MEMORY_BYTES, Task

    def kernel_ms(tables: list[TableSpec], batch: int) -> tuple[float, float]:
        memory = min(MAX_MEMORY_BYTES, max(1, sum(t.size_bytes for t in tables)))
        task = Task(
            tables=list(tables),
            num_devices=1,
            memory_bytes=memory,
            batch_size=batch,
            allow_oversized=True,
        )
        pred = agent.predict(task, [0] * len(tables))
        return float(pred.fwd_ms[0]), float(pred.bwd_ms[0])

    return kernel_ms


def cost_network_kernels(agent: Predictor) -> KernelsFn:
    """``kernels_ms`` from an agent's cost network, each kernel on a device of its own
    (kernels already priced are remembered)."""
    from torchrec_dreamshard.data.tasks import MAX_MEMORY_BYTES, Task

    seen: dict[tuple, tuple[float, float]] = {}

    def predict(calls: list[tuple[list[TableSpec], int]], batch: int) -> None:
        tables = [
            dataclasses.replace(t, name=f"{t.name}#{d}")
            for d, (group, _) in enumerate(calls)
            for t in group
        ]
        placement = [d for d, (group, _) in enumerate(calls) for _ in group]
        task = Task(
            tables=tables,
            num_devices=len(calls),
            memory_bytes=min(MAX_MEMORY_BYTES, max(1, sum(t.size_bytes for t in tables))),
            batch_size=batch,
            allow_oversized=True,
        )
        pred = agent.predict(task, placement)
        for d, (group, _) in enumerate(calls):
            seen[(batch, tuple(group))] = (float(pred.fwd_ms[d]), float(pred.bwd_ms[d]))

    def kernels_ms(calls: list[tuple[list[TableSpec], int]]) -> list[tuple[float, float]]:
        keys = [(batch, tuple(tables)) for tables, batch in calls]
        new = {k: (list(k[1]), k[0]) for k in keys if k not in seen and k[1]}
        for batch in sorted({b for b, _ in new}):
            todo = [c for k, c in new.items() if k[0] == batch]
            for start in range(0, len(todo), KERNELS_PER_PREDICTION):
                predict(todo[start : start + KERNELS_PER_PREDICTION], batch)
        return [seen.get(k, (0.0, 0.0)) for k in keys]

    return kernels_ms


def scaled_kernel(kernel_ms: KernelFn, speed: tuple[float, float]) -> KernelFn:
    """``kernel_ms`` with its forward and backward multiplied by ``speed``."""

    def scaled(tables: list[TableSpec], batch: int) -> tuple[float, float]:
        f, b = kernel_ms(tables, batch)
        return f * speed[0], b * speed[1]

    return scaled


def scaled_kernels(kernels_ms: KernelsFn, speed: tuple[float, float]) -> KernelsFn:
    """``kernels_ms`` with every forward and backward multiplied by ``speed``."""

    def scaled(calls: list[tuple[list[TableSpec], int]]) -> list[tuple[float, float]]:
        return [(f * speed[0], b * speed[1]) for f, b in kernels_ms(calls)]

    return scaled


class ScreeningKernels:
    """Fused kernels priced cheaply for screening: the tables' single-table kernels summed,
    scaled per batch by the fusion ratio :meth:`calibrate` measures on one plan.

    Args:
        exact: the cost network's ``kernels_ms``.
    """

    def __init__(self, exact: KernelsFn | None) -> None:
        if exact is None:
            raise ValueError("screening needs the cost network's kernels_ms")
        self.exact = exact
        self.ratio: dict[int, tuple[float, float]] = {}
        self.single: dict[tuple[int, int], tuple[float, float]] = {}
        self._alive: list[TableSpec] = []  # keeps the ids in ``single`` unique
        self.last_calls: list[tuple[list[TableSpec], int]] = []

    def summed(self, calls: list[tuple[list[TableSpec], int]]) -> list[tuple[float, float]]:
        """Per call, the sum of its tables' single-table kernels (remembered by identity)."""
        missing = {
            (b, id(t)): t for tables, b in calls for t in tables if (b, id(t)) not in self.single
        }
        if missing:
            keys = list(missing)
            times = self.exact([([missing[k]], k[0]) for k in keys])
            self.single.update(zip(keys, times, strict=True))
            self._alive.extend(missing.values())
        out = []
        for tables, b in calls:
            part = [self.single[(b, id(t))] for t in tables]
            out.append((sum(f for f, _ in part), sum(x for _, x in part)))
        return out

    def calibrate(self, calls: list[tuple[list[TableSpec], int]]) -> None:
        """Fusion ratios per batch: exact over summed, over the kernels of ``calls``."""
        fused, summed = self.exact(calls), self.summed(calls)
        for batch in {b for _, b in calls}:
            idx = [i for i, (tables, b) in enumerate(calls) if b == batch and len(tables) > 1]
            top = [sum(fused[i][j] for i in idx) for j in (0, 1)]
            low = [sum(summed[i][j] for i in idx) for j in (0, 1)]
            if all(x > 0 for x in low):
                self.ratio[batch] = (top[0] / low[0], top[1] / low[1])

    def __call__(self, calls: list[tuple[list[TableSpec], int]]) -> list[tuple[float, float]]:
        self.last_calls = calls
        out = []
        for (tables, batch), (f, b) in zip(calls, self.summed(calls), strict=True):
            rf, rb = self.ratio.get(batch, (1.0, 1.0)) if len(tables) > 1 else (1.0, 1.0)
            out.append((f * rf, b * rb))
        return out
