"""``DreamShardProposer``: one proposal, whose table-wise tables sit where the policy says.

Tables DreamShard does not place (see :mod:`torchrec_dreamshard.planner.enumerators`) take
TorchRec's best-rated option and are placed first by TorchRec's ``GreedyPerfPartitioner``;
the policy then places the DreamShard tables in the memory each device has left. The
devices are written into the options' ``shard.rank``, which
:class:`~torchrec_dreamshard.planner.partitioners.DreamShardPartitioner` keeps.

Splits. Tables the enumerator marks splittable (``split_widths``) may be cut column-wise by
:func:`torchrec_dreamshard.split_search.plan_with_splits`: a table too big for every device is
split to fit, others when the cost network predicts a faster step. A split table's
table-wise option is replaced by a column-wise fused option (the enumerator's
``column_wise_option``, with TorchRec's storage estimate of each shard) whose shards carry
the devices chosen; the shards are listed in :attr:`DreamShardProposer.last_shards`.

Memory. The policy counts a table's weight bytes, TorchRec's storage estimate also counts
optimizer state and input/output buffers. The policy is given each device's memory scaled
by the tables' weight-to-storage ratio; if TorchRec's estimate still overflows a device,
that device's share is shrunk and the policy runs again (a few times at most).
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Sequence
from typing import Any

from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.types import (
    Enumerator,
    Partitioner,
    PlannerError,
    PlannerErrorType,
    Proposer,
    ShardingOption,
    StorageReservation,
    Topology,
)

from torchrec_dreamshard.planner.types import (
    PLACEMENT_MODES,
    PlacementAgent,
    device_capacity,
    is_dreamshard_option,
    memory_tier,
    option_bytes,
    spec_for_option,
    storage_bytes,
)
from torchrec_dreamshard.split_search import SplitPlan, plan_with_splits
from torchrec_dreamshard.splits import plan_entries, shard_task
from torchrec_dreamshard.tables import TableSpec
from torchrec_dreamshard.tasks import Task
from torchrec_dreamshard.torchrec_adapter import reserved_topology

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
        self._fallback = fallback_partitioner or GreedyPerfPartitioner()
        self._search_space: list[ShardingOption] = []
        self._enumerator: Enumerator | None = None
        self._done = False
        self.last_placement: dict[str, int] = {}
        self.last_shards: dict[str, list[dict]] = {}
        self.last_report: Any = None  # the agent's SafetyReport of an unsplit proposal

    def load(self, search_space: list[ShardingOption], enumerator: Enumerator | None = None):
        """Take the enumerated options; the next :meth:`propose` runs the policy."""
        self._search_space = search_space
        self._enumerator = enumerator
        self._done = False

    def feedback(
        self,
        partitionable: bool,
        plan: list[ShardingOption] | None = None,
        perf_rating: float | None = None,
        storage_constraint: Topology | None = None,
    ) -> None:
        """One proposal is all DreamShard makes; feedback is not needed."""

    def propose(self) -> list[ShardingOption] | None:
        """The policy's plan the first time, then ``None``."""
        if self._done or not self._search_space:
            return None
        self._done = True
        constraint = self._storage_constraint()
        ours, others = self._choose_options(constraint)
        used = self._place_others(others, constraint)
        left = [cap - u for cap, u in zip(device_capacity(constraint), used, strict=True)]
        if ours:
            found = self._place_ours(ours, left, memory_tier(constraint))
            ours = self._ranked_options(ours, found)
        return others + ours

    def _ranked_options(self, ours: list[ShardingOption], found: SplitPlan) -> list[ShardingOption]:
        """The options with the plan's devices in their shards' ranks: table-wise for the
        whole tables, the enumerator's column-wise option for each split one."""
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
        self.last_placement = whole
        self.last_shards = shards
        return out

    def _column_wise(self, option: ShardingOption, columns: list[tuple]) -> ShardingOption:
        make = getattr(self._enumerator, "column_wise_option", None)
        if make is None:
            raise PlannerError(
                "DreamShard split a table but the enumerator cannot make column-wise options; "
                "use DreamShardEnumerator",
                PlannerErrorType.OTHER,
            )
        return make(option, columns)

    # -- steps ----------------------------------------------------------------------------

    def _choose_options(
        self, constraint: Topology
    ) -> tuple[list[ShardingOption], list[ShardingOption]]:
        """One option per table: the DreamShard one, or TorchRec's best-rated one among
        those whose every shard fits the largest device."""
        tier = memory_tier(constraint)
        biggest = max(device_capacity(constraint))

        def rank_key(o: ShardingOption) -> tuple[bool, float]:
            fits = all(storage_bytes(s.storage, tier) <= biggest for s in o.shards)
            return (not fits, o.total_perf)

        by_fqn: dict[str, list[ShardingOption]] = {}
        for option in self._search_space:
            by_fqn.setdefault(option.fqn, []).append(option)
        ours, others = [], []
        for options in by_fqn.values():
            mine = [o for o in options if is_dreamshard_option(o)]
            if mine:
                ours.append(mine[0])
            else:
                others.append(min(options, key=rank_key))
        return ours, others

    def _storage_constraint(self) -> Topology:
        return reserved_topology(self._reservation, self._topology)

    def _place_others(self, others: list[ShardingOption], constraint: Topology) -> list[int]:
        """Place TorchRec's tables with its partitioner; bytes they use on each device."""
        tier = memory_tier(constraint)
        used = [0] * constraint.world_size
        if not others:
            return used
        try:
            self._fallback.partition(others, copy.deepcopy(constraint))
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
        widths = self._split_widths()
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

    def _split_widths(self) -> dict[str, int]:
        return dict(getattr(self._enumerator, "split_widths", None) or {})

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
                    task, mode=self._mode, num_samples=self._num_samples, seed=self._seed
                )
                self.last_report = getattr(self._agent, "last_report", None)
                return SplitPlan(shard_task(task, {}), list(placement), math.nan, None)
            found = plan_with_splits(
                self._agent,
                task,
                mode=self._mode,
                num_samples=self._num_samples,
                seed=self._seed,
                splittable=widths,
            )
            # the report describes the whole-table placement; a split plan is re-placed
            split = bool(found.sharded.columns)
            self.last_report = None if split else getattr(self._agent, "last_report", None)
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
                f"{biggest} bytes",
                PlannerErrorType.INSUFFICIENT_STORAGE,
            )

    def _spec(self, option: ShardingOption) -> TableSpec:
        spec_fn = getattr(self._enumerator, "table_spec", None)
        return spec_fn(option) if spec_fn is not None else spec_for_option(option)
