"""Which sharding type each table gets, chosen by predicted step cost: the proposer's stage
before the policy's tables are placed.

The policy places tables table-wise (and splits some column-wise). Where the search space
also offers a table another type the cost strategies let the type choice offer (those with
an ``alternative_kernel``, :mod:`torchrec_dreamshard.cost.sharding_types`: today
data-parallel, row-wise and table-row-wise), :class:`TypeChooser` decides which tables leave
table-wise, by the typed cost model (:func:`torchrec_dreamshard.cost.plans.plan_cost`: the
cost network's fused kernels per rank, and every collective from the machine's fitted
models, across hosts from the topology's bandwidths). Everything type-specific comes from
the type's strategy:

* candidates are prefixes of one order per type (its ``candidate_key``: data-parallel the
  smallest tables first, row-wise and table-row-wise the hottest first, by the cost
  network's single-table cost); prefixes of 1, 4, 16, ... tables and all of them, then
  halving the gaps beside the best, and the best of each type together;
* each candidate's moved tables take their strategy's ranks (``candidate_ranks``) and
  memory (``reserve``); its table-wise tables are balanced greedily by their single-table
  cost in the memory left, and the whole plan is rated;
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

from torchrec_dreamshard.cost.comm_topology import CommTopology
from torchrec_dreamshard.cost.dense_kernel_model import DenseKernelModel
from torchrec_dreamshard.cost.plans import (
    ScreeningKernels,
    cost_network_kernel,
    cost_network_kernels,
    plan_cost,
    scaled_kernel,
    scaled_kernels,
)
from torchrec_dreamshard.cost.sharding import CostContext, TableChoice
from torchrec_dreamshard.cost.sharding_types import (
    BY_TORCHREC_TYPE,
    STRATEGIES,
    TermsCache,
    alternative_kernels,
    alternative_types,
)
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.measure.collectives import CollectiveModels
from torchrec_dreamshard.measure.embedding_kernels import REFERENCE_BATCH_SIZE, REFERENCE_TABLES
from torchrec_dreamshard.measure.reference_speed import speed_ratio
from torchrec_dreamshard.planner.device_memory import option_bytes, storage_bytes
from torchrec_dreamshard.planner.option_kinds import (
    DREAMSHARD_COMPUTE_KERNEL,
    DREAMSHARD_SHARDING_TYPE,
)
from torchrec_dreamshard.planner.plan_prediction import prediction_task
from torchrec_dreamshard.policy.protocol import PlacementAgent

TYPE_MARGIN = 0.02  # a typed plan must be rated this much below all-table-wise to win
PREFIX_GROWTH = 4  # each candidate of a type moves this many times the tables of the last

SpecFn = Callable[[ShardingOption], TableSpec]


def alternatives(
    search_space: Sequence[ShardingOption], fqns: set[str]
) -> dict[str, dict[str, ShardingOption]]:
    """The options of another type than table-wise the search space offers each of
    ``fqns`` on that type's kernel (its strategy's ``alternative_kernel``), by table and
    type."""
    kernels = alternative_kernels()
    out: dict[str, dict[str, ShardingOption]] = {}
    for o in search_space:
        if o.fqn in fqns and kernels.get(o.sharding_type) == o.compute_kernel:
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
            and o.sharding_type == DREAMSHARD_SHARDING_TYPE
            and o.compute_kernel == DREAMSHARD_COMPUTE_KERNEL
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
        screening = dataclasses.replace(self.ctx, kernels_ms=screen)
        rate = _Rater(screening, ours, specs, costs, capacity, tier, exact.terms)
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
        """Per alternative type, the tables that may take it in the order tried (its
        strategy's ``candidate_key``, ties by position)."""
        out = []
        for strategy in alternative_types():
            kind = strategy.name
            idx = [i for i, o in enumerate(ours) if kind in alts.get(o.fqn, {})]
            idx.sort(key=lambda i: (*strategy.candidate_key(specs[i], float(costs[i])), i))
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
    """Rates a candidate (which tables move to which option): the moved tables' memory
    and ranks as their strategies say, the table-wise tables balanced greedily in the
    memory left, the whole plan priced by :func:`plan_cost` with the kernels of ``ctx``;
    ``inf`` when the table-wise tables do not fit."""

    def __init__(self, ctx, ours, specs, costs, capacity, tier, terms=None) -> None:
        self.ctx, self.ours, self.specs, self.costs = ctx, ours, specs, costs
        self.capacity = np.asarray(capacity, dtype=np.float64)
        self.tier = tier
        self.need = np.array([option_bytes(o, tier) for o in ours], dtype=np.float64)
        self.pooled = [bool(o.is_pooled) for o in ours]  # a sequence table is not
        self.terms = TermsCache() if terms is None else terms
        self.count = 0

    def __call__(self, moved: dict[str, ShardingOption]) -> float:
        self.count += 1
        free = self.capacity.copy()
        for option in moved.values():
            shard_bytes = [storage_bytes(s.storage, self.tier) for s in option.shards]
            STRATEGIES[option.sharding_type].reserve(shard_bytes, free)
        if (free < 0).any():
            return math.inf
        ranks = self._balance([i for i, o in enumerate(self.ours) if o.fqn not in moved], free)
        if ranks is None:
            return math.inf
        tw = DREAMSHARD_SHARDING_TYPE
        choices = [TableChoice(table=self.specs[i], sharding_type=tw, ranks=(r,)) for i, r in ranks]
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
        return plan_cost(choices, self.ctx, self.terms).step_ms

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


def typed_choices(plan: Sequence[ShardingOption], spec_fn: SpecFn) -> list[TableChoice]:
    """The tables of a partitioned plan as the typed cost model sees them: each option's
    type by the strategy that prices it (TorchRec's table-column-wise as column-wise), its
    ranks as the strategy takes them; a sequence table is unpooled.

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


def typed_step_ms(plan: Sequence[ShardingOption], chooser: TypeChooser, spec_fn: SpecFn) -> float:
    """A whole plan's step by the typed cost model."""
    return plan_cost(typed_choices(plan, spec_fn), chooser.ctx).step_ms
