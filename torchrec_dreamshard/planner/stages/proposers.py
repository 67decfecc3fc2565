"""``DreamShardProposer``: one proposal, a sharding option for every table.

The policy's tables take their table-wise fused option, the others TorchRec's best-rated;
then :class:`~torchrec_dreamshard.planner.type_choice.type_choice.TypeChooser` moves the
tables another type rates better. Ranks are the partitioner's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    Proposer,
    ShardingOption,
    StorageReservation,
    Topology,
)

from torchrec_dreamshard.cost.collective_models import CollectiveModels
from torchrec_dreamshard.cost.dense_kernel_model import DenseKernelModel
from torchrec_dreamshard.cost.sharding_path_model import ShardingPathModel
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.planner.adapters.device_memory import (
    device_capacity,
    memory_tier,
    option_bytes,
)
from torchrec_dreamshard.planner.adapters.torchrec_adapter import reserved_topology
from torchrec_dreamshard.planner.plans.plan_prediction import prediction_task
from torchrec_dreamshard.planner.stages.candidates import default_sources
from torchrec_dreamshard.planner.stages.option_specs import SpecFn, spec_for_option
from torchrec_dreamshard.planner.stages.proposal import DreamShardProposal
from torchrec_dreamshard.planner.stages.search_space import choose_options, split_widths
from torchrec_dreamshard.planner.type_choice.type_choice import (
    TypeChooser,
    TypePlan,
    alternatives,
    sequence_options,
)
from torchrec_dreamshard.policy import CandidateSource
from torchrec_dreamshard.policy.protocol import PlacementAgent


@dataclass(frozen=True)
class MachineModels:
    """The type choice's models of this machine, as callables asked only when it prices
    tables (``None``, or giving ``None``: the default).

    Attributes:
        collectives: fitted collective models (default: every policy table table-wise).
        dense_kernel: data-parallel tables' dense-kernel model (default: analytic).
        reference_ms: the reference kernel's time here (default: kernels as predicted).
        sharding_path: a sharding path's cost beyond kernels and collectives (default: 0).
    """

    collectives: Callable[[], CollectiveModels | None] | None = None
    dense_kernel: Callable[[], DenseKernelModel | None] | None = None
    reference_ms: Callable[[], tuple[float, float] | None] | None = None
    sharding_path: Callable[[], ShardingPathModel | None] | None = None


class DreamShardProposer(Proposer):
    """Proposes one option per table: the policy's, the type choice's where another type
    rates better, TorchRec's best-rated for the rest.

    Args:
        batch_size: the *global* batch the table-wise kernels process.
        constraints: TorchRec per-table constraints (``min_partition`` of splits).
        spec_fn: the planner's table specs (default: shapes and pooling only).
        machine: the type choice's models (``None``: every policy table stays table-wise).
        sources: the candidate sources a calibrating agent calibrates with.
    """

    def __init__(
        self,
        agent: PlacementAgent,
        topology: Topology,
        batch_size: int,
        storage_reservation: StorageReservation | None = None,
        constraints: dict[str, ParameterConstraints] | None = None,
        spec_fn: SpecFn | None = None,
        machine: MachineModels | None = None,
        sources: tuple[CandidateSource, ...] | None = None,
    ) -> None:
        self._agent = agent
        self._topology = topology
        self._batch_size = batch_size
        self._reservation = storage_reservation
        self._constraints = constraints
        self._spec: SpecFn = spec_fn or spec_for_option
        self._search_space: list[ShardingOption] = []
        self._widths: dict[str, int] = {}
        self._done = False
        self._constraint = topology
        self._options: tuple[list[ShardingOption], list[ShardingOption]] = ([], [])
        self._priced: _Priced | None = None
        machine = machine if machine is not None else MachineModels()
        self._collectives = machine.collectives
        self._machine = (
            machine.dense_kernel or (lambda: None),
            machine.reference_ms or (lambda: None),
            machine.sharding_path or (lambda: None),
        )
        self.sources: tuple[CandidateSource, ...] = sources or default_sources(reserved=True)
        self.last_types: TypePlan | None = None  # the type choice of the last proposal
        self.type_chooser: TypeChooser | None = None  # and the chooser that made it

    def load(self, search_space: list[ShardingOption], enumerator: Enumerator | None = None):
        """Pick each table's option; the agent prepares where the type choice will price."""
        self._search_space = search_space
        self._widths = split_widths(
            search_space, self._constraints, self._topology.world_size, self._spec
        )
        self._done = False
        self.last_types = None
        self._constraint = reserved_topology(self._reservation, self._topology)
        self._options = choose_options(search_space, self._constraint, self._widths)
        self._priced = self._priced_tables(*self._options)
        if self._priced is not None:
            specs = [self._spec(o) for o in self._priced.tables]
            task = prediction_task(specs, self._topology.world_size, self._batch_size)
            self._agent.prepare(task, self.sources)

    def policy_task(self, search_space: list[ShardingOption]) -> Task | None:
        """The policy's tables of ``search_space`` as a task (``None``: none) for the
        machine profile to calibrate on."""
        widths = split_widths(
            search_space, self._constraints, self._topology.world_size, self._spec
        )
        constraint = reserved_topology(self._reservation, self._topology)
        ours, _ = choose_options(search_space, constraint, widths)
        if not ours:
            return None
        specs = [self._spec(o) for o in ours]
        return prediction_task(specs, self._topology.world_size, self._batch_size)

    def feedback(
        self,
        partitionable: bool,
        plan: list[ShardingOption] | None = None,
        perf_rating: float | None = None,
        storage_constraint: Topology | None = None,
    ) -> None:
        """One proposal is all DreamShard makes; feedback is not needed."""

    def propose(self) -> DreamShardProposal | None:
        """The proposal the first time, then ``None``."""
        if self._done or not self._search_space:
            return None
        self._done = True
        ours, others = self._options
        if self._priced is not None:
            ours, others = self._choose_types(ours, others, self._priced)
        widths = {o.fqn: self._widths[o.fqn] for o in ours if o.fqn in self._widths}
        return DreamShardProposal(others + ours, [o.fqn for o in ours], widths)

    def _priced_tables(
        self, ours: list[ShardingOption], others: list[ShardingOption]
    ) -> _Priced | None:
        """What the type choice prices (``None``: nothing, or no collective models)."""
        tier = memory_tier(self._constraint)
        biggest = max(device_capacity(self._constraint))
        seq = sequence_options(self._search_space, {o.fqn for o in others})
        fits = [o for o in ours + seq if option_bytes(o, tier) <= biggest]
        alts = alternatives(self._search_space, {o.fqn for o in fits})
        if not alts or self._collectives is None or self._collectives() is None:
            return None
        return _Priced(fits, alts, seq)

    def _choose_types(
        self, ours: list[ShardingOption], others: list[ShardingOption], priced: _Priced
    ) -> tuple[list[ShardingOption], list[ShardingOption]]:
        """The policy's options and the others after the type choice moved tables."""
        tier = memory_tier(self._constraint)
        capacity = device_capacity(self._constraint)
        alts, seq_fqns = priced.alternatives, {o.fqn for o in priced.sequences}
        self.type_chooser = chooser = self._chooser()
        rest = [o for o in others if o.fqn not in seq_fqns or o.fqn not in alts]
        taken = sum(option_bytes(o, tier) for o in rest) / len(capacity)
        plan = chooser.choose(priced.tables, alts, [c - taken for c in capacity], tier)
        self.last_types, moved = plan, plan.moved
        chosen = [moved.get(o.fqn, o) for o in priced.sequences if o.fqn in alts]
        return [o for o in ours if o.fqn not in moved], rest + chosen + [
            option for fqn, option in moved.items() if fqn not in seq_fqns
        ]

    def _chooser(self) -> TypeChooser:
        dense, reference, path = self._machine
        return TypeChooser(
            self._agent,
            self._topology,
            self._batch_size,
            self._spec,
            self._collectives(),
            dense(),
            None if self._agent.calibration_enabled else reference(),
            path(),
        )


@dataclass(frozen=True)
class _Priced:
    """The tables the type choice prices, their other types, and the sequence tables."""

    tables: list[ShardingOption]
    alternatives: dict[str, dict[str, ShardingOption]]
    sequences: list[ShardingOption]
