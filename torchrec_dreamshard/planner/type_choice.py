"""Which sharding type each table gets, chosen by predicted step cost: a stage before the
policy places the table-wise tables.

The policy places tables table-wise (and splits some column-wise). Where the search space
also offers a table data-parallel, row-wise or table-row-wise, :class:`TypeChooser`
decides which tables leave table-wise, by the typed cost model
(:func:`torchrec_dreamshard.cost.plans.plan_cost`: the cost network's fused kernels per
rank, and every collective from the machine's fitted models, across hosts from the
topology's bandwidths):

* candidates are prefixes of two orders: for data-parallel, the tables by bytes ascending
  (replicating a table costs an all-reduce of its bytes and a pass over them on every rank;
  it saves its all-to-all and its kernel at the global batch), for row-wise and
  table-row-wise, by the cost network's single-table cost descending (the hottest table
  is the one that sets a device's load); prefixes of 1, 4, 16, ... tables and all of them,
  then halving the gaps beside the best, and the best of each type together;
* each candidate's table-wise tables are balanced greedily by their single-table cost in
  the memory its replicated and row-wise shards leave, and the whole plan is rated;
* the candidate rated lowest wins only if it beats all-table-wise by more than
  :data:`TYPE_MARGIN` (the model's uncertainty): type choice must not cost a step.

The rules of thumb (tiny tables replicated, hot tables spread) are not written here: they
come out of the rating, and how much they pay depends on the collectives' speed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from torchrec.distributed.planner.types import ShardingOption, Topology
from torchrec.distributed.types import ShardingType

from torchrec_dreamshard.cost.comm_topology import CommTopology
from torchrec_dreamshard.cost.plans import (
    ScreeningKernels,
    cost_network_kernel,
    cost_network_kernels,
    plan_cost,
    scaled_kernel,
    scaled_kernels,
    terms_cost,
)
from torchrec_dreamshard.cost.sharding import (
    CostContext,
    TableChoice,
    Terms,
    job_terms,
    table_terms,
)
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.measure.collectives import CollectiveModels
from torchrec_dreamshard.measure.dense_kernels import DenseKernelModel
from torchrec_dreamshard.measure.kernels import REFERENCE_BATCH_SIZE, REFERENCE_TABLES
from torchrec_dreamshard.measure.reference_speed import speed_ratio
from torchrec_dreamshard.planner.types import option_bytes, prediction_task
from torchrec_dreamshard.policy.protocol import PlacementAgent

DP = ShardingType.DATA_PARALLEL.value
TW = ShardingType.TABLE_WISE.value
RW = ShardingType.ROW_WISE.value
TWRW = ShardingType.TABLE_ROW_WISE.value
ALTERNATIVE_KERNELS: dict[str, str] = {DP: "dense", RW: "fused", TWRW: "fused"}
TYPE_MARGIN = 0.02  # a typed plan must be rated this much below all-table-wise to win
PREFIX_GROWTH = 4  # each candidate of a type moves this many times the tables of the last

SpecFn = Callable[[ShardingOption], TableSpec]


def alternatives(
    search_space: Sequence[ShardingOption], fqns: set[str]
) -> dict[str, dict[str, ShardingOption]]:
    """The data-parallel (dense), row-wise and table-row-wise (fused) options the search
    space offers each of ``fqns``, by table and type."""
    out: dict[str, dict[str, ShardingOption]] = {}
    for o in search_space:
        if o.fqn in fqns and ALTERNATIVE_KERNELS.get(o.sharding_type) == o.compute_kernel:
            out.setdefault(o.fqn, {}).setdefault(o.sharding_type, o)
    return out


def sequence_options(
    search_space: Sequence[ShardingOption], fqns: set[str]
) -> list[ShardingOption]:
    """The table-wise fused option of every sequence (unpooled) table among ``fqns``."""
    out: dict[str, ShardingOption] = {}
    for o in search_space:
        if (
            o.fqn in fqns
            and not o.is_pooled
            and o.sharding_type == TW
            and o.compute_kernel == "fused"
        ):
            out.setdefault(o.fqn, o)
    return list(out.values())


@dataclass
class TypePlan:
    """What the type choice decided.

    Attributes:
        moved: the option chosen for every table that leaves table-wise, by fqn.
        step_ms: the chosen plan's predicted step (typed cost model, greedy placement).
        table_wise_ms: all-table-wise, rated the same way.
        rated: candidates rated.
        speed: the factors (fwd, bwd) the cost network's kernels were scaled by.
    """

    moved: dict[str, ShardingOption] = field(default_factory=dict)
    step_ms: float = math.nan
    table_wise_ms: float = math.nan
    rated: int = 0
    speed: tuple[float, float] = (1.0, 1.0)

    def lines(self) -> list[str]:
        counts: dict[str, int] = {}
        for o in self.moved.values():
            counts[o.sharding_type] = counts.get(o.sharding_type, 0) + 1
        kinds = ", ".join(f"{n} {t}" for t, n in sorted(counts.items())) or "none"
        return [
            f"Sharding types: {kinds} besides table-wise ({self.rated} candidates rated);",
            f"  predicted step {self.step_ms:.3f} ms, all table-wise {self.table_wise_ms:.3f} ms"
            + (
                f" (fused kernels x{self.speed[0]:.2f} fwd, x{self.speed[1]:.2f} bwd: in "
                "this machine's time)"
                if self.speed != (1.0, 1.0)
                else ""
            ),
        ]


class TypeChooser:
    """Chooses which tables leave table-wise (see the module docstring).

    Args:
        agent: the DreamShard agent (its cost network prices the kernels).
        topology: TorchRec's topology (ranks, hosts, bandwidths).
        batch_size: the global batch.
        spec_fn: the planner's table specs.
        collectives: the machine's fitted collective models.
        dense_kernel: the machine's fitted model of the dense kernel data-parallel tables
            run (``None``: priced analytically, see :mod:`torchrec_dreamshard.cost.sharding`).
        reference_ms: the reference kernel's ``(fwd_ms, bwd_ms)`` measured on this
            machine: the cost network's fused kernels are scaled by it over the network's
            prediction of it, so that they are priced in this machine's time beside the
            measured dense kernel and collectives
            (:mod:`torchrec_dreamshard.measure.reference_speed`). Not for an agent that
            calibrates (its kernels are this machine's already), nor when ``None``.
    """

    def __init__(
        self,
        agent: PlacementAgent,
        topology: Topology,
        batch_size: int,
        spec_fn: SpecFn,
        collectives: CollectiveModels,
        dense_kernel: DenseKernelModel | None = None,
        reference_ms: tuple[float, float] | None = None,
    ) -> None:
        self._agent = agent
        self._spec = spec_fn
        self._world = topology.world_size
        self._batch = batch_size
        kernel, kernels = cost_network_kernel(agent), cost_network_kernels(agent)
        self.speed = (1.0, 1.0)  # this machine's time over the cost network's
        if reference_ms is not None and not agent.calibration_enabled:
            predicted = kernel(list(REFERENCE_TABLES), REFERENCE_BATCH_SIZE)
            self.speed = speed_ratio(reference_ms, predicted)
            kernel, kernels = scaled_kernel(kernel, self.speed), scaled_kernels(kernels, self.speed)
        self.ctx = CostContext(
            batch_size=batch_size,
            topology=CommTopology.from_torchrec(topology),
            collectives=collectives,
            kernel_ms=kernel,
            kernels_ms=kernels,
            dense_kernel=dense_kernel,
        )

    def choose(
        self,
        ours: Sequence[ShardingOption],
        alts: dict[str, dict[str, ShardingOption]],
        capacity: Sequence[int],
        tier: str,
    ) -> TypePlan:
        """The best typed plan of the candidates, or none moved (see the module docstring)."""
        specs = [self._spec(o) for o in ours]
        costs = self._single_costs(specs)
        screen = ScreeningKernels(self.ctx.kernels_ms)
        exact = _Rater(self.ctx, ours, specs, costs, capacity, tier)
        rate = _Rater(dataclasses.replace(self.ctx, kernels_ms=screen), *exact.args, exact.terms)
        base_exact = exact({})
        rate({})  # the all-table-wise plan's kernels set the screening's fusion ratios
        screen.calibrate(screen.last_calls)
        base = rate({})
        rated = [(base, {})]
        for kind, order in self._orders(ours, alts, specs, costs):
            moves = [{f: alts[f][kind] for f in order[:k]} for k in range(len(order) + 1)]
            step, k = _best_prefix(lambda k, moves=moves: rate(moves[k]), len(order))
            rated.append((step, moves[k]))
        winners = [m for step, m in rated[1:] if step < base]
        if len(winners) > 1:  # the best of each type together (the first type keeps a table)
            union = {k: v for m in reversed(winners) for k, v in m.items()}
            rated.append((rate(union), union))
        step, moved = min(rated, key=lambda x: x[0])
        step = exact(moved) if moved else base_exact
        if not step < base_exact * (1 - TYPE_MARGIN):
            step, moved = base_exact, {}
        return TypePlan(moved, step, base_exact, rate.count + exact.count, self.speed)

    def _single_costs(self, specs: list[TableSpec]) -> np.ndarray:
        if not specs:
            return np.zeros(0)
        task = prediction_task(specs, self._world, self._batch)
        return np.asarray(self._agent.table_costs(task), dtype=np.float64)

    @staticmethod
    def _orders(ours, alts, specs, costs) -> list[tuple[str, list[str]]]:
        """Per alternative type, the tables that may take it in the order tried."""
        out = []
        for kind in (DP, RW, TWRW):
            idx = [i for i, o in enumerate(ours) if kind in alts.get(o.fqn, {})]
            if kind == DP:
                idx.sort(key=lambda i: (specs[i].size_bytes, i))
            else:
                idx.sort(key=lambda i: (-costs[i], i))
            if idx:
                out.append((kind, [ours[i].fqn for i in idx]))
        return out


def _best_prefix(rate: Callable[[int], float], n: int) -> tuple[float, int]:
    """The lowest-rated prefix length ``k`` in ``1..n``: a coarse sweep
    (:func:`_prefix_sizes`), then halving the gaps on either side of the best."""
    seen = {k: rate(k) for k in _prefix_sizes(n)}
    while True:
        best = min(seen, key=lambda k: (seen[k], k))
        lower = max((k for k in seen if k < best), default=0)
        upper = min((k for k in seen if k > best), default=best)
        trial = [k for k in ((lower + best) // 2, (best + upper) // 2) if k > 0 and k not in seen]
        if not trial:
            return seen[best], best
        seen.update({k: rate(k) for k in trial})


def _prefix_sizes(n: int) -> list[int]:
    """1, 4, 16, ... tables, and all ``n``."""
    sizes, k = [], 1
    while k < n:
        sizes.append(k)
        k *= PREFIX_GROWTH
    return sizes + [n] if n else []


class _Rater:
    """Rates a candidate (which tables move to which option): the table-wise tables
    balanced greedily in the memory left, the whole plan priced by the typed cost model
    with the kernels of ``ctx``; ``inf`` when the table-wise tables do not fit."""

    def __init__(self, ctx, ours, specs, costs, capacity, tier, terms=None) -> None:
        self.args = (ours, specs, costs, capacity, tier)
        self.ctx, self.ours, self.specs, self.costs = ctx, ours, specs, costs
        self.capacity = np.asarray(capacity, dtype=np.float64)
        self.tier = tier
        self.need = np.array([option_bytes(o, tier) for o in ours], dtype=np.float64)
        self.pooled = [bool(o.is_pooled) for o in ours]  # a sequence table is not
        self.terms: dict[TableChoice, Terms] = {} if terms is None else terms
        self.count = 0

    def __call__(self, moved: dict[str, ShardingOption]) -> float:
        self.count += 1
        free = self.capacity.copy()
        for option in moved.values():
            for k, shard in enumerate(option.shards):
                bytes_ = 0 if shard.storage is None else getattr(shard.storage, self.tier)
                if option.sharding_type == DP or len(option.shards) == len(free):
                    free[k % len(free)] -= bytes_
                else:
                    free -= bytes_ / len(free)  # a host's shards: charged evenly here
        if (free < 0).any():
            return math.inf
        ranks = self._balance([i for i, o in enumerate(self.ours) if o.fqn not in moved], free)
        if ranks is None:
            return math.inf
        choices = [TableChoice(table=self.specs[i], sharding_type=TW, ranks=(r,)) for i, r in ranks]
        topo, hosts = self.ctx.topology, 0
        for i, o in enumerate(self.ours):
            if o.fqn in moved:
                kind, r = moved[o.fqn].sharding_type, ()
                if kind == TWRW:  # hosts in turn
                    r, hosts = topo.host_ranks(hosts % topo.num_hosts), hosts + 1
                choices.append(
                    TableChoice(
                        table=self.specs[i], sharding_type=kind, ranks=r, pooled=self.pooled[i]
                    )
                )
        return self.step_ms(choices)

    def step_ms(self, choices: list[TableChoice]) -> float:
        """``plan_cost(choices).step_ms``, each choice's terms built once per choice."""
        ctx = self.ctx
        kernels, exchanges, dense = [], [], []
        for c in choices:
            terms = self.terms.get(c)
            if terms is None:
                terms = self.terms[c] = table_terms(c, ctx)
            kernels += terms.kernels
            exchanges += terms.exchanges
            dense += terms.dense_bytes
        total = job_terms(ctx) + Terms(tuple(kernels), tuple(exchanges), tuple(dense))
        return terms_cost(total, ctx).step_ms

    def _balance(self, idx: list[int], free: np.ndarray) -> list[tuple[int, int]] | None:
        load = np.zeros(len(free))
        out = []
        for i in sorted(idx, key=lambda i: (-self.costs[i], i)):
            room = np.flatnonzero(free >= self.need[i])
            if room.size == 0:
                return None
            r = int(room[np.argmin(load[room])])
            free[r] -= self.need[i]
            load[r] += self.costs[i]
            out.append((i, r))
        return out


TYPED = {DP, TW, RW, TWRW, ShardingType.COLUMN_WISE.value}


def typed_choices(plan: Sequence[ShardingOption], spec_fn: SpecFn) -> list[TableChoice]:
    """The tables of a partitioned plan as the typed cost model sees them (TorchRec's
    table-column-wise counts as column-wise; a sequence table is unpooled).

    Raises:
        ValueError: a sharding type the typed cost model does not price (named).
    """
    out = []
    for o in plan:
        kind = (
            ShardingType.COLUMN_WISE.value
            if o.sharding_type == "table_column_wise"
            else o.sharding_type
        )
        if kind not in TYPED:
            raise ValueError(f"{o.fqn}: sharding type {o.sharding_type!r} is not priced")
        ranks = tuple(int(s.rank) for s in o.shards)
        if kind in (DP, RW):
            ranks = ()
        out.append(
            TableChoice(table=spec_fn(o), sharding_type=kind, ranks=ranks, pooled=o.is_pooled)
        )
    return out


def typed_step_ms(plan: Sequence[ShardingOption], chooser: TypeChooser, spec_fn: SpecFn) -> float:
    """A whole plan's step by the typed cost model."""
    return plan_cost(typed_choices(plan, spec_fn), chooser.ctx).step_ms
