"""Rating a sharding-type candidate (:class:`CandidateRater`), and a partitioned plan as the
typed cost model sees it (:func:`typed_choices`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from torchrec.distributed.planner.types import ShardingOption

from torchrec_dreamshard.cost.comm_topology import (
    FlowTotals,
    cross_host_ms,
)
from torchrec_dreamshard.cost.plans import (
    PlanBreakdown,
    comm_costs,
    kernel_costs,
    merged_exchanges,
    plan_breakdown,
    plan_cost,
)
from torchrec_dreamshard.cost.sharding import (
    PATH_KIND,
    CostContext,
    Exchange,
    KernelCall,
    TableChoice,
    Terms,
)
from torchrec_dreamshard.cost.sharding_types import (
    BY_TORCHREC_TYPE,
    STRATEGIES,
    TermsCache,
)
from torchrec_dreamshard.planner.adapters.device_memory import option_bytes, storage_bytes
from torchrec_dreamshard.planner.stages.option_kinds import DREAMSHARD_SHARDING_TYPE
from torchrec_dreamshard.planner.stages.option_specs import SpecFn
from torchrec_dreamshard.planner.type_choice.type_margin import TypeSummary


class CandidateRater:
    """Rates a candidate: the moved tables on their strategies' ranks, the table-wise tables
    balanced greedily in the memory left, the plan priced by :func:`plan_cost` (``inf``:
    they do not fit)."""

    def __init__(self, ctx, ours, specs, costs, capacity, tier, terms=None, loads=None) -> None:
        self.ctx, self.ours, self.specs, self.costs = ctx, ours, specs, costs
        self.capacity = np.asarray(capacity, dtype=np.float64)
        self.tier = tier
        self.need = np.array([option_bytes(o, tier) for o in ours], dtype=np.float64)
        self.pooled = [bool(o.is_pooled) for o in ours]  # a sequence table is not
        self.terms = TermsCache() if terms is None else terms
        self.loads = (
            table_wise_loads(ctx, specs, self.pooled, self.terms) if loads is None else loads
        )
        self.count = 0
        self._bytes: dict[int, tuple[ShardingOption, list[float]]] = {}

    def __call__(self, moved: dict[str, ShardingOption]) -> float:
        self.count += 1
        choices = self._choices(moved)
        return math.inf if choices is None else plan_cost(choices, self.ctx, self.terms).step_ms

    def summary(self, moved: dict[str, ShardingOption]) -> TypeSummary:
        """The plan of ``moved`` explained per type (it must fit): :func:`type_summary`."""
        choices = self._choices(moved)
        if choices is None:
            raise ValueError("the candidate does not fit the devices' memory")
        return type_summary(choices, self.ctx, self.terms)

    def breakdown(self, moved: dict[str, ShardingOption]) -> PlanBreakdown:
        """The plan of ``moved`` priced by source (it must fit)."""
        choices = self._choices(moved)
        if choices is None:
            raise ValueError("the candidate does not fit the devices' memory")
        return plan_breakdown(choices, self.ctx, self.terms)

    def balanced(self, moved: dict[str, ShardingOption]) -> list[tuple[int, int]] | None:
        """``(table index, rank)`` of the table-wise tables of ``moved``'s plan."""
        free = self.capacity.copy()
        load = np.zeros(len(free))
        topo, turns = self.ctx.topology, dict.fromkeys(STRATEGIES, 0)
        for i, o in enumerate(self.ours):
            option = moved.get(o.fqn)
            if option is None:
                continue
            STRATEGIES[option.sharding_type].reserve(self._shard_bytes(option), free)
            kind = option.sharding_type
            ranks = STRATEGIES[kind].candidate_ranks(turns[kind], topo) or range(len(free))
            turns[kind] += 1
            load[list(ranks)] += self.loads[i, 0] / len(ranks)  # its kernel, spread
        if (free < 0).any():
            return None
        idx = [i for i, o in enumerate(self.ours) if o.fqn not in moved]
        return self._balance(idx, free, load)

    def _choices(self, moved: dict[str, ShardingOption]) -> list[TableChoice] | None:
        ranks = self.balanced(moved)
        if ranks is None:
            return None
        tw = DREAMSHARD_SHARDING_TYPE
        choices = [
            TableChoice(table=self.specs[i], sharding_type=tw, ranks=(r,), pooled=self.pooled[i])
            for i, r in ranks
        ]
        return choices + self.moved_choices(moved)

    def moved_choices(self, moved: dict[str, ShardingOption]) -> list[TableChoice]:
        """The choices of the tables ``moved`` takes off table-wise."""
        choices = []
        topo, turns = self.ctx.topology, dict.fromkeys(STRATEGIES, 0)
        for i, o in enumerate(self.ours):
            if o.fqn in moved:
                kind = moved[o.fqn].sharding_type
                r = STRATEGIES[kind].candidate_ranks(turns[kind], topo)
                turns[kind] += 1
                choices.append(
                    TableChoice(
                        table=self.specs[i], sharding_type=kind, ranks=r, pooled=self.pooled[i]
                    )
                )
        return choices

    def _shard_bytes(self, option: ShardingOption) -> list[float]:
        """Each shard's bytes of ``option`` in the tier (remembered per option)."""
        key = id(option)
        if key not in self._bytes:
            self._bytes[key] = (
                option,
                [storage_bytes(s.storage, self.tier) for s in option.shards],
            )
        return self._bytes[key][1]

    def _balance(
        self, idx: list[int], free: np.ndarray, load: np.ndarray
    ) -> list[tuple[int, int]] | None:
        """Largest first, each table-wise table on the least loaded rank with room."""
        out = []
        total = self.loads.sum(1)
        for i in sorted(idx, key=lambda i: (-total[i], i)):
            room = np.flatnonzero(free >= self.need[i])
            if room.size == 0:
                return None
            r = int(room[np.argmin(load[room])])
            free[r] -= self.need[i]
            load[r] += total[i]
            out.append((i, r))
        return out


def table_wise_loads(ctx, specs, pooled, terms_of) -> np.ndarray:
    """``[n, 2]`` what each table costs its rank table-wise: its kernel and the per-byte cost
    of the outputs it sends (latency left out)."""
    if not specs:
        return np.zeros((0, 2))
    tw = DREAMSHARD_SHARDING_TYPE
    choices = [
        TableChoice(table=t, sharding_type=tw, ranks=(0,), pooled=p)
        for t, p in zip(specs, pooled, strict=True)
    ]
    all_terms = [terms_of(c, ctx) for c in choices]
    calls = [([k.table for k in t.kernels], k0.batch) for t in all_terms for k0 in t.kernels[:1]]
    kernels = ctx.kernels_ms(calls) if ctx.kernels_ms else [ctx.kernel_ms(*c) for c in calls]
    model = ctx.collectives.models["all_to_all"]
    out = np.zeros((len(specs), 2))
    for i, t in enumerate(all_terms):
        out[i, 0] = sum(kernels[i])
        for e in t.exchanges:
            if isinstance(e.flows, FlowTotals):
                sent, cross = e.flows.sent[0], e.flows.remote_sent[0]
                out[i, 1] += model.ms_per_mb * sent / 1e6 + cross_host_ms(
                    ctx.topology, ctx.collectives, cross
                )
    return out


def typed_choices(plan: Sequence[ShardingOption], spec_fn: SpecFn) -> list[TableChoice]:
    """The tables of a partitioned plan as the typed cost model sees them.

    Raises:
        ValueError: a sharding type no strategy prices (named).
    """
    out = []
    for o in plan:
        strategy = BY_TORCHREC_TYPE.get(o.sharding_type)
        if strategy is None:
            raise ValueError(f"{o.fqn}: sharding type {o.sharding_type!r} is not priced")
        ranks = strategy.option_ranks([int(s.rank) for s in o.shards])
        out.append(
            TableChoice(
                table=spec_fn(o), sharding_type=strategy.name, ranks=ranks, pooled=o.is_pooled
            )
        )
    return out


def type_summary(choices: Sequence[TableChoice], ctx: CostContext, terms_of) -> TypeSummary:
    """Per type: tables, bytes and the slowest rank's ms; the slowest rank, its step and the
    cross-host bytes (a collective's ms split by its types' bytes)."""
    cost = plan_cost(choices, ctx, terms_of)
    totals = [r.total_ms for r in cost.ranks]
    slowest = int(np.argmax(totals))
    tables: dict[str, int] = {}
    nbytes: dict[str, float] = {}
    kernels: dict[str, list[KernelCall]] = {}
    exchanges: list[Exchange] = []
    for c in choices:
        kind = c.sharding_type
        tables[kind] = tables.get(kind, 0) + 1
        nbytes[kind] = nbytes.get(kind, 0.0) + c.table.size_bytes
        terms = terms_of(c, ctx)
        kernels.setdefault(kind, []).extend(k for k in terms.kernels if k.rank == slowest)
        exchanges.extend(terms.exchanges)
    share = {kind: _kernel_ms(calls, ctx, slowest) for kind, calls in kernels.items()}
    cross = 0.0
    for e in merged_exchanges(exchanges):
        one = comm_costs(Terms(exchanges=(e,)), ctx)[slowest]
        kind = e.tag.split("/")[0]
        share[kind] = share.get(kind, 0.0) + float(one)
        cross += _cross_bytes(e, ctx)
    return TypeSummary(tables, nbytes, share, slowest, float(totals[slowest]), cross)


def _kernel_ms(calls: list[KernelCall], ctx: CostContext, rank: int) -> float:
    """The fwd + bwd ms of ``calls`` on ``rank`` (their fused and dense kernels)."""
    if not calls:
        return 0.0
    fwd, bwd = kernel_costs(Terms(tuple(calls)), ctx)
    return float(fwd[rank] + bwd[rank])


def _cross_bytes(e: Exchange, ctx: CostContext) -> float:
    """Bytes one collective moves across hosts, one way each."""
    if e.kind == PATH_KIND:
        return 0.0
    if isinstance(e.flows, FlowTotals):
        return float(e.flows.remote_sent.sum())
    if e.flows is not None:
        return float(FlowTotals.from_matrix(ctx.topology, e.flows).remote_sent.sum())
    each = ctx.topology.ring_cross_bytes(e.kind, e.ranks, e.buffer_bytes)
    return each * len(e.ranks)
