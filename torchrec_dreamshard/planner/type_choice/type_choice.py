"""Which sharding type each table gets, by predicted step cost (:class:`TypeChooser`): the
proposer's stage before the policy places the table-wise tables.

Each alternative type (its strategy's ``alternative_kernel``) offers prefixes of one order
of tables (:mod:`.type_prefixes`); each candidate's moved tables take their strategy's ranks
and memory, the rest are balanced greedily and the plan is rated by
:func:`torchrec_dreamshard.cost.plans.plan_cost`. A type's best is kept only if its gain
over all-table-wise clears the margin (:mod:`.type_margin`); with none, the plan stays
table-wise.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from torchrec.distributed.planner.types import ShardingOption, Topology

from torchrec_dreamshard.cost.collective_models import CollectiveModels
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
from torchrec_dreamshard.cost.sharding import CostContext
from torchrec_dreamshard.cost.sharding_path_model import ShardingPathModel
from torchrec_dreamshard.cost.sharding_types import (
    alternative_kernels,
    alternative_types,
)
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.measure.embedding_kernels import REFERENCE_BATCH_SIZE, REFERENCE_TABLES
from torchrec_dreamshard.measure.reference_speed import speed_ratio
from torchrec_dreamshard.planner.plans.plan_prediction import prediction_task
from torchrec_dreamshard.planner.stages.option_kinds import (
    DREAMSHARD_COMPUTE_KERNEL,
    DREAMSHARD_SHARDING_TYPE,
)
from torchrec_dreamshard.planner.stages.option_specs import SpecFn
from torchrec_dreamshard.planner.type_choice.type_margin import (
    TYPE_MARGIN,
    Z_SCORE,
    ModelErrors,
    TypeDecision,
    TypeSummary,
    model_errors,
)
from torchrec_dreamshard.planner.type_choice.type_prefixes import decided_once, type_candidates
from torchrec_dreamshard.planner.type_choice.type_rating import CandidateRater, typed_choices
from torchrec_dreamshard.planner.type_choice.type_screening import ScreeningRater
from torchrec_dreamshard.policy.protocol import PlacementAgent


def alternatives(
    search_space: Sequence[ShardingOption], fqns: set[str]
) -> dict[str, dict[str, ShardingOption]]:
    """The options of each alternative type the search space offers each of ``fqns``."""
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
        step_ms: the chosen plan's predicted step.
        table_wise_ms: all-table-wise, rated the same way.
        rated: candidates rated.
        speed: the factors (fwd, bwd) the cost network's kernels were scaled by.
        decisions: each type's best candidate against all-table-wise.
        errors: the model errors the margins used.
        summary: the chosen plan explained per type.
    """

    moved: dict[str, ShardingOption] = field(default_factory=dict)
    step_ms: float = math.nan
    table_wise_ms: float = math.nan
    rated: int = 0
    speed: tuple[float, float] = (1.0, 1.0)
    decisions: list[TypeDecision] = field(default_factory=list)
    errors: ModelErrors | None = None
    summary: TypeSummary | None = None

    def to_dict(self) -> dict:
        """JSON-able: what moved, the two steps and every decision."""
        return {
            "moved": {fqn: o.sharding_type for fqn, o in sorted(self.moved.items())},
            "step_ms": self.step_ms,
            "table_wise_ms": self.table_wise_ms,
            "rated": self.rated,
            "speed": list(self.speed),
            "decisions": [d.to_dict() for d in self.decisions],
            "errors": self.errors.to_dict() if self.errors is not None else None,
            "summary": self.summary.to_dict() if self.summary is not None else None,
        }

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
            *(d.line() for d in self.decisions),
            *(self.summary.lines() if self.summary is not None else []),
        ]


class TypeChooser:
    """Chooses which tables leave table-wise (see the module docstring).

    Args:
        batch_size: the global batch.
        dense_kernel: the fitted dense kernel of data-parallel tables (``None``: analytic).
        reference_ms: this machine's reference kernel ``(fwd_ms, bwd_ms)``, to scale the
            cost network's kernels by (``None``, or a calibrating agent: not scaled).
        sharding_path: the measured cost of one sharding path (``None``: not charged).
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
        sharding_path: ShardingPathModel | None = None,
    ) -> None:
        self._agent = agent
        self._path_error_ms = 0.0 if sharding_path is None else sharding_path.error_ms
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
            mem_bw=dense_pass_bandwidth(topology),
            collectives=collectives,
            kernel_ms=kernel,
            kernels_ms=kernels,
            dense_kernel=dense_kernel,
            path_ms=0.0 if sharding_path is None else sharding_path.unmodelled_ms(collectives),
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
        exact = CandidateRater(self.ctx, ours, specs, costs, capacity, tier)
        screening = dataclasses.replace(self.ctx, kernels_ms=screen)
        slow = CandidateRater(
            screening, ours, specs, costs, capacity, tier, exact.terms, exact.loads
        )
        base_exact = exact({})
        slow({})  # the all-table-wise plan's kernels set the screening's fusion ratios
        screen.calibrate(screen.last_calls)
        rate = ScreeningRater(slow, screen)
        errors = model_errors(
            self._agent,
            self._spread(exact),
            self.ctx.collectives,
            self.ctx.dense_kernel,
            path_ms=self.ctx.path_ms,
            path_error_ms=self._path_error_ms,
        )
        fits = math.isfinite(base_exact)
        base_parts = exact.breakdown({}).at_slowest() if fits else {}
        decide = decided_once(
            functools.partial(
                _decide, exact=exact, base_ms=base_exact, base_parts=base_parts, errors=errors
            )
        )
        orders = self._orders(ours, alts, specs, costs)
        # the count moves only where the inputs were measured: collectives fitted to timings
        simplify = fits and bool(errors.collectives)
        rated, fewest_of = type_candidates(orders, alts, rate, decide if simplify else None)
        if not fits:  # all-table-wise does not fit: no margin to clear
            fitting = [(exact(m), m) for _, m in rated[1:] if m]
            fitting = [(step, m) for step, m in fitting if math.isfinite(step)]
            step, moved = min(fitting, key=lambda x: x[0]) if fitting else (base_exact, {})
            count = rate.count + slow.count + exact.count
            return TypePlan(moved, step, base_exact, count, self.speed, [], errors)
        decisions, kept = [], []
        for _, moved in rated[1:]:
            if not moved:
                continue
            decision = decide(moved)
            if decision is None:
                continue
            decision.fewest_of = fewest_of.get(decision.kind)
            decisions.append(decision)
            if decision.kept:
                kept.append((base_exact - decision.gain_ms, moved))
        step, moved = min(kept, key=lambda x: x[0]) if kept else (base_exact, {})
        count = rate.count + slow.count + exact.count
        summary = exact.summary(moved)
        return TypePlan(moved, step, base_exact, count, self.speed, decisions, errors, summary)

    def _spread(self, exact: CandidateRater) -> float:
        """The cost network's ensemble spread (``step_log_std``) on the all-table-wise plan."""
        placed = exact.balanced({})
        if not placed:
            return 0.0
        task = prediction_task(
            [self._spec(exact.ours[i]) for i, _ in placed], self._world, self._batch
        )
        spread = float(self._agent.predict(task, [r for _, r in placed]).step_log_std)
        return spread if math.isfinite(spread) else 0.0

    def _single_costs(self, specs: list[TableSpec]) -> np.ndarray:
        if not specs:
            return np.zeros(0)
        task = prediction_task(specs, self._world, self._batch)
        return np.asarray(self._agent.table_costs(task), dtype=np.float64)

    @staticmethod
    def _orders(ours, alts, specs, costs) -> list[tuple[str, list[str]]]:
        """Per alternative type, the tables that may take it in the order tried."""
        out = []
        for strategy in alternative_types():
            kind = strategy.name
            idx = [i for i, o in enumerate(ours) if kind in alts.get(o.fqn, {})]
            idx.sort(key=lambda i: (*strategy.candidate_key(specs[i], float(costs[i])), i))
            if idx:
                out.append((kind, [ours[i].fqn for i in idx]))
        return out


def dense_pass_bandwidth(topology: Topology) -> float:
    """Bytes/ms the analytic dense passes stream at: the devices' HBM, or DDR on CPU ranks."""
    if topology.compute_device == "cpu":
        return float(topology.ddr_mem_bw)
    return float(topology.hbm_mem_bw)


def _decide(
    moved: dict[str, ShardingOption],
    exact: CandidateRater,
    base_ms: float,
    base_parts: dict[str, float],
    errors: ModelErrors,
) -> TypeDecision | None:
    """``moved`` against all-table-wise: its exact step, gain by source, ``U`` and margin."""
    kinds = sorted({o.sharding_type for o in moved.values()})
    name = "+".join(kinds)
    step = exact(moved)
    if not math.isfinite(step):
        return None  # it does not fit: no decision to make
    parts = exact.breakdown(moved).at_slowest()
    sources = sorted(set(base_parts) | set(parts))
    gain = {k: base_parts.get(k, 0.0) - parts.get(k, 0.0) for k in sources}
    err = errors.errors(base_parts, parts)
    u = math.sqrt(sum(v * v for v in err.values()))
    margin = max(Z_SCORE * u, TYPE_MARGIN * base_ms)
    total = base_ms - step
    return TypeDecision(name, len(moved), total, u, margin, total > margin, gain, err)


def typed_step_ms(plan: Sequence[ShardingOption], chooser: TypeChooser, spec_fn: SpecFn) -> float:
    """A whole plan's step by the typed cost model."""
    return plan_cost(typed_choices(plan, spec_fn), chooser.ctx).step_ms
