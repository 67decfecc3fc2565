"""``DreamShardProposer``: one proposal, whose table-wise tables sit where the policy says.

Tables DreamShard does not place (see :mod:`torchrec_dreamshard.planner.enumerators`) take
TorchRec's best-rated option and are placed first by TorchRec's ``GreedyPerfPartitioner``;
the policy then places the DreamShard tables in the memory each device has left. The
devices are written into the options' ``shard.rank``, which
:class:`~torchrec_dreamshard.planner.partitioners.DreamShardPartitioner` keeps.

Which options: :func:`~torchrec_dreamshard.planner.options.choose_options`, on whatever
search space it is given (DreamShard's enumerator's or a user's).

Splits. Tables the search space also offers column-wise on the fused kernel
(:func:`~torchrec_dreamshard.planner.options.split_widths`) may be cut column-wise by
:func:`torchrec_dreamshard.policy.split_search.plan_with_splits`: a table too big for
every device is split to fit, others when the cost network predicts a faster step. A split table's
table-wise option is replaced by a column-wise fused option (estimated by the planner's
enumerator: TorchRec's storage estimate of each shard) whose shards carry the devices
chosen.

Failure. When the tables cannot be placed, the proposal is still made and
:meth:`DreamShardProposer.failure` holds the error (naming the tables and what to change);
:class:`~torchrec_dreamshard.planner.partitioners.DreamShardPartitioner` raises it, so
TorchRec's planner treats it as it treats any proposal that does not partition.

Memory. The policy counts a table's weight bytes, TorchRec's storage estimate also counts
optimizer state and input/output buffers. The policy is given each device's memory scaled
by the tables' weight-to-storage ratio; if TorchRec's estimate still overflows a device,
that device's share is shrunk and the policy runs again (a few times at most).
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Sequence

from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    Partitioner,
    PlannerError,
    PlannerErrorType,
    Proposer,
    ShardingOption,
    StorageReservation,
    Topology,
)

from torchrec_dreamshard.data.splits import plan_entries, shard_task
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure.collectives import CollectiveModels
from torchrec_dreamshard.measure.dense_kernels import DenseKernelModel
from torchrec_dreamshard.planner.candidates import default_sources
from torchrec_dreamshard.planner.options import (
    SpecFn,
    choose_options,
    column_wise_option,
    split_widths,
)
from torchrec_dreamshard.planner.torchrec_adapter import reserved_topology
from torchrec_dreamshard.planner.type_choice import (
    TypeChooser,
    TypePlan,
    alternatives,
    sequence_options,
)
from torchrec_dreamshard.planner.types import (
    PLACEMENT_MODES,
    device_capacity,
    memory_tier,
    option_bytes,
    prediction_task,
    spec_for_option,
    storage_bytes,
)
from torchrec_dreamshard.policy import CandidateSource
from torchrec_dreamshard.policy.protocol import PlacementAgent
from torchrec_dreamshard.policy.safety_net import SafetyReport
from torchrec_dreamshard.policy.split_search import SplitPlan, plan_with_splits

logger: logging.Logger = logging.getLogger(__name__)

MAX_MEMORY_ROUNDS = 6  # policy runs before giving up on a device's memory
MEMORY_SHRINK = 0.97  # extra margin when a device's share is shrunk


class DreamShardProposer(Proposer):
    """Proposes the policy's placement.

    Args:
        agent: the DreamShard agent.
        topology: the devices (memory is read from the storage reservation's reserved
            topology when there is one).
        batch_size: the *global* batch the table-wise kernels process.
        storage_reservation: the planner's storage reservation.
        mode: ``"safe"``, ``"greedy"`` or ``"search"`` (see :class:`DreamShardPlanner`).
        num_samples: sampled policy roll-outs (safe and search modes).
        seed: sampling seed.
        fallback_partitioner: places the tables TorchRec plans (default greedy by perf).
        constraints: TorchRec per-table constraints (``min_partition`` of splits).
        spec_fn: the planner's table specs (default: shapes and pooling only).
        collectives: gives the machine's fitted collective models, asked for only when the
            search space offers a table data-parallel, row-wise or table-row-wise; then
            :class:`~torchrec_dreamshard.planner.type_choice.TypeChooser` decides which
            tables leave table-wise (``None``: every policy table stays table-wise).
        dense_kernel: gives the machine's fitted dense-kernel model the type choice prices
            data-parallel tables with (``None``, or giving ``None``: analytic).
        reference_ms: gives the reference kernel's time here, to price the cost network's
            kernels in this machine's time (``None``, or giving ``None``: as predicted).
    """

    def __init__(
        self,
        agent: PlacementAgent,
        topology: Topology,
        batch_size: int,
        storage_reservation: StorageReservation | None = None,
        mode: str = "safe",
        num_samples: int = 4,
        seed: int = 0,
        fallback_partitioner: Partitioner | None = None,
        constraints: dict[str, ParameterConstraints] | None = None,
        spec_fn: SpecFn | None = None,
        collectives: Callable[[], CollectiveModels] | None = None,
        dense_kernel: Callable[[], DenseKernelModel | None] | None = None,
        reference_ms: Callable[[], tuple[float, float] | None] | None = None,
    ) -> None:
        if mode not in PLACEMENT_MODES:
            raise ValueError(f"mode must be one of {PLACEMENT_MODES}, got {mode!r}")
        self._agent = agent
        self._topology = topology
        self._batch_size = batch_size
        self._reservation = storage_reservation
        self._mode = mode
        self._num_samples = num_samples
        self._seed = seed
        self.fallback = fallback_partitioner or GreedyPerfPartitioner()
        self._constraints = constraints
        self._spec: SpecFn = spec_fn or spec_for_option
        self._search_space: list[ShardingOption] = []
        self._enumerator: Enumerator | None = None
        self._widths: dict[str, int] = {}
        self._done = False
        self._proposal: list[ShardingOption] | None = None
        self._failure: PlannerError | None = None
        self._collectives = collectives
        self._machine = (dense_kernel or (lambda: None), reference_ms or (lambda: None))
        self.sources: tuple[CandidateSource, ...] = default_sources()  # TorchRec's plan
        self.last_report: SafetyReport | None = None  # the safety net's, unsplit proposals
        self.last_types: TypePlan | None = None  # the type choice of the last proposal
        self.type_chooser: TypeChooser | None = None  # and the chooser that made it

    def load(self, search_space: list[ShardingOption], enumerator: Enumerator | None = None):
        """Take the enumerated options; the next :meth:`propose` runs the policy."""
        self._search_space = search_space
        self._enumerator = enumerator
        self._widths = split_widths(
            search_space, self._constraints, self._topology.world_size, self._spec
        )
        self._done = False
        self._proposal, self._failure = None, None
        self.last_report, self.last_types = None, None

    def feedback(
        self,
        partitionable: bool,
        plan: list[ShardingOption] | None = None,
        perf_rating: float | None = None,
        storage_constraint: Topology | None = None,
    ) -> None:
        """One proposal is all DreamShard makes; feedback is not needed."""

    def propose(self) -> list[ShardingOption] | None:
        """The policy's plan the first time, then ``None``.

        When the policy cannot place the tables (memory), the proposal is still made, and
        :meth:`failure` gives the partitioner the error to raise for it, so that TorchRec's
        planner records the failure, tries the other proposers and, when none succeeds,
        classifies it as it classifies its own."""
        if self._done or not self._search_space:
            return None
        self._done = True
        constraint = self._storage_constraint()
        ours, others = choose_options(self._search_space, constraint, self._widths)
        ours, others = self._choose_types(ours, others, constraint)
        try:
            used = self._place_others(others, constraint)
            left = [cap - u for cap, u in zip(device_capacity(constraint), used, strict=True)]
            if ours:
                found = self._place_ours(ours, left, memory_tier(constraint))
                ours = self._ranked_options(ours, found)
        except PlannerError as exc:
            self._failure = exc
        self._proposal = others + ours
        return self._proposal

    def _choose_types(
        self, ours: list[ShardingOption], others: list[ShardingOption], constraint: Topology
    ) -> tuple[list[ShardingOption], list[ShardingOption]]:
        """Move the tables the type choice takes off table-wise to TorchRec's machinery
        (their chosen option, placed with the others). Tables that fit no device whole (to
        be split) stay with the policy. Sequence tables (TorchRec's to place) join the
        choice as sequence lookups: table-wise unless another type rates better."""
        tier = memory_tier(constraint)
        capacity = device_capacity(constraint)
        seq = sequence_options(self._search_space, {o.fqn for o in others})
        fits = [o for o in ours + seq if option_bytes(o, tier) <= max(capacity)]
        alts = alternatives(self._search_space, {o.fqn for o in fits})
        if not alts or self._collectives is None:
            return ours, others
        specs = [self._spec(o) for o in fits]
        # a calibrating agent calibrates here, so the choice prices calibrated kernels
        self._agent.prepare(
            prediction_task(specs, self._topology.world_size, self._batch_size), self.sources
        )
        dense, reference = self._machine  # a calibrating agent's kernels need no scale
        self.type_chooser = chooser = TypeChooser(
            self._agent, self._topology, self._batch_size, self._spec, self._collectives(),
            dense(), None if self._agent.calibration_enabled else reference(),
        )  # fmt: skip
        seq_fqns = {o.fqn for o in seq}
        rest = [o for o in others if o.fqn not in seq_fqns or o.fqn not in alts]
        taken = sum(option_bytes(o, tier) for o in rest) / len(capacity)
        self.last_types = chooser.choose(fits, alts, [c - taken for c in capacity], tier)
        moved = self.last_types.moved
        chosen = [moved.get(o.fqn, o) for o in seq if o.fqn in alts]
        return [o for o in ours if o.fqn not in moved], rest + chosen + [
            option for fqn, option in moved.items() if fqn not in seq_fqns
        ]

    def failure(self, proposal: list[ShardingOption]) -> PlannerError | None:
        """Why ``proposal`` cannot be partitioned, if it is this proposer's failed one."""
        return self._failure if proposal is self._proposal else None

    def _ranked_options(self, ours: list[ShardingOption], found: SplitPlan) -> list[ShardingOption]:
        """The options with the plan's devices in their shards' ranks: table-wise for the
        whole tables, a column-wise option for each split one."""
        whole, shards = plan_entries(found.sharded, found.placement)
        out = []
        for option in ours:
            if option.fqn in whole:
                for shard in option.shards:
                    shard.rank = whole[option.fqn]
                out.append(option)
                continue
            entries = shards[option.fqn]
            split = self._column_wise(option, [tuple(e["columns"]) for e in entries])
            for shard, entry in zip(split.shards, entries, strict=True):
                shard.rank = entry["device"]
            out.append(split)
        return out

    def _column_wise(self, option: ShardingOption, columns: list[tuple]) -> ShardingOption:
        if self._enumerator is None:
            raise PlannerError(
                "DreamShard split a table but was given no enumerator to estimate its "
                "column-wise shards; call load(search_space, enumerator)",
                PlannerErrorType.OTHER,
            )
        return column_wise_option(self._enumerator, option, columns)

    # -- steps ----------------------------------------------------------------------------

    def _storage_constraint(self) -> Topology:
        return reserved_topology(self._reservation, self._topology)

    def _place_others(self, others: list[ShardingOption], constraint: Topology) -> list[int]:
        """Place TorchRec's tables with its partitioner; bytes they use on each device."""
        tier = memory_tier(constraint)
        used = [0] * constraint.world_size
        if not others:
            return used
        try:
            self.fallback.partition(others, copy.deepcopy(constraint))
        except PlannerError as exc:
            raise PlannerError(
                "TorchRec's partitioner could not place the tables DreamShard leaves to it "
                f"({sorted(o.fqn for o in others)}): {exc}",
                exc.error_type,
            ) from exc
        for option in others:
            for shard in option.shards:
                used[shard.rank] += storage_bytes(shard.storage, tier)
        return used

    def _place_ours(self, ours: list[ShardingOption], left: list[int], tier: str) -> SplitPlan:
        """Run the policy (and the split search) until TorchRec's storage estimate fits
        every device."""
        specs = [self._spec(o) for o in ours]
        need = [option_bytes(o, tier) for o in ours]
        widths = {o.fqn: self._widths[o.fqn] for o in ours if o.fqn in self._widths}
        self._check_fits(ours, need, left, widths)
        ratio = sum(t.size_bytes for t in specs) / max(1, sum(need))
        caps = [max(1, int(x * min(1.0, ratio))) for x in left]
        by_fqn = {o.fqn: (o, n) for o, n in zip(ours, need, strict=True)}
        for _ in range(MAX_MEMORY_ROUNDS):
            found = self._run_policy(specs, caps, widths)
            used, holders = self._storage_used(found, by_fqn, tier, len(left))
            over = [d for d, (u, cap) in enumerate(zip(used, left, strict=True)) if u > cap]
            if not over:
                return found
            for d in over:
                caps[d] = max(1, int(caps[d] * max(left[d], 0) / used[d] * MEMORY_SHRINK))
        names = sorted({name for d in over for name in holders[d]})
        raise PlannerError(
            f"DreamShard could not fit the tables {names} on devices {over}: TorchRec's "
            f"storage estimate exceeds the memory left there after {MAX_MEMORY_ROUNDS} "
            "attempts; give the devices more memory or add devices",
            PlannerErrorType.INSUFFICIENT_STORAGE,
        )

    def _storage_used(
        self, found: SplitPlan, by_fqn: dict, tier: str, world: int
    ) -> tuple[list[int], list[set[str]]]:
        """TorchRec's storage estimate on each device of a plan, and the tables there."""
        used = [0] * world
        holders: list[set[str]] = [set() for _ in range(world)]
        whole, shards = plan_entries(found.sharded, found.placement)
        for fqn, d in whole.items():
            used[d] += by_fqn[fqn][1]
            holders[d].add(fqn)
        for fqn, entries in shards.items():
            option = by_fqn[fqn][0]
            split = self._column_wise(option, [tuple(e["columns"]) for e in entries])
            for shard, entry in zip(split.shards, entries, strict=True):
                used[entry["device"]] += storage_bytes(shard.storage, tier)
                holders[entry["device"]].add(fqn)
        return used, holders

    def _run_policy(
        self, specs: Sequence[TableSpec], caps: list[int], widths: dict[str, int]
    ) -> SplitPlan:
        try:
            task = Task(
                tables=list(specs),
                num_devices=len(caps),
                memory_bytes=caps,
                batch_size=self._batch_size,
                allow_oversized=bool(widths),
            )
            if not widths:  # nothing may be split: the policy's placement as it is
                placement = self._agent.place(
                    task,
                    mode=self._mode,
                    num_samples=self._num_samples,
                    seed=self._seed,
                    sources=self.sources,
                )
                self.last_report = self._agent.last_report
                return SplitPlan(shard_task(task, {}), list(placement), math.nan, None)
            found = plan_with_splits(
                self._agent,
                task,
                mode=self._mode,
                num_samples=self._num_samples,
                seed=self._seed,
                splittable=widths,
                sources=self.sources,
            )
            # the report describes the whole-table placement; a split plan is re-placed
            split = bool(found.sharded.columns)
            self.last_report = None if split else self._agent.last_report
            return found
        except ValueError as exc:  # PlacementError is a ValueError
            raise PlannerError(
                f"DreamShard could not place the tables: {exc}",
                PlannerErrorType.INSUFFICIENT_STORAGE,
            ) from exc

    def _check_fits(
        self, ours: list[ShardingOption], need: list[int], left: list[int], widths: dict
    ) -> None:
        if sum(need) > sum(max(x, 0) for x in left):
            raise PlannerError(
                f"the {len(ours)} table-wise tables need {sum(need)} bytes (TorchRec's storage "
                f"estimate: weights, optimizer state, input/output buffers) but the "
                f"{len(left)} devices have {sum(max(x, 0) for x in left)} bytes left after "
                "TorchRec's storage reservation and the tables TorchRec placed; add devices "
                "or memory, or allow row_wise/column_wise sharding for the largest tables",
                PlannerErrorType.INSUFFICIENT_STORAGE,
            )
        biggest = max(left)
        misfits = [
            f"{o.fqn} ({n} bytes)"
            for o, n in zip(ours, need, strict=True)
            if n > biggest and o.fqn not in widths
        ]
        if misfits:
            raise PlannerError(
                f"tables {misfits} fit on no device: the most memory any device has left "
                f"after TorchRec's storage reservation and the tables TorchRec placed is "
                f"{biggest} bytes, and no other sharding type their ParameterConstraints "
                "allow fits either: allow row_wise or column_wise for them, add devices or "
                "memory, or make them smaller",
                PlannerErrorType.INSUFFICIENT_STORAGE,
            )
