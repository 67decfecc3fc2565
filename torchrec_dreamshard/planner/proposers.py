"""``DreamShardProposer``: one proposal, whose table-wise tables sit where the policy says.

Tables DreamShard does not place (see :mod:`torchrec_dreamshard.planner.enumerators`) take
TorchRec's best-rated option and are placed first by TorchRec's ``GreedyPerfPartitioner``;
the policy then places the DreamShard tables in the memory each device has left. The
devices are written into the options' ``shard.rank``, which
:class:`~torchrec_dreamshard.planner.partitioners.DreamShardPartitioner` keeps.

Memory. The policy counts a table's weight bytes, TorchRec's storage estimate also counts
optimizer state and input/output buffers. The policy is given each device's memory scaled
by the tables' weight-to-storage ratio; if TorchRec's estimate still overflows a device,
that device's share is shrunk and the policy runs again (a few times at most).
"""

from __future__ import annotations

import copy
import logging
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
        self.last_report: Any = None  # the agent's SafetyReport of the last proposal

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
            placement = self._place_ours(ours, left, memory_tier(constraint))
            for option, device in zip(ours, placement, strict=True):
                for shard in option.shards:
                    shard.rank = device
            self.last_placement = {o.fqn: d for o, d in zip(ours, placement, strict=True)}
        return others + ours

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

    def _place_ours(self, ours: list[ShardingOption], left: list[int], tier: str) -> list[int]:
        """Run the policy until TorchRec's storage estimate fits every device."""
        specs = [self._spec(o) for o in ours]
        need = [option_bytes(o, tier) for o in ours]
        self._check_fits(ours, need, left)
        ratio = sum(t.size_bytes for t in specs) / max(1, sum(need))
        caps = [max(1, int(x * min(1.0, ratio))) for x in left]
        for _ in range(MAX_MEMORY_ROUNDS):
            placement = self._run_policy(specs, caps)
            used = [0] * len(left)
            for d, n in zip(placement, need, strict=True):
                used[d] += n
            over = [d for d, (u, cap) in enumerate(zip(used, left, strict=True)) if u > cap]
            if not over:
                return placement
            for d in over:
                caps[d] = max(1, int(caps[d] * max(left[d], 0) / used[d] * MEMORY_SHRINK))
        names = [o.fqn for o, d in zip(ours, placement, strict=True) if d in over]
        raise PlannerError(
            f"DreamShard could not fit the tables {names} on devices {over}: TorchRec's "
            f"storage estimate exceeds the memory left there after {MAX_MEMORY_ROUNDS} "
            "attempts; give the devices more memory or add devices",
            PlannerErrorType.INSUFFICIENT_STORAGE,
        )

    def _run_policy(self, specs: Sequence[TableSpec], caps: list[int]) -> list[int]:
        try:
            task = Task(
                tables=list(specs),
                num_devices=len(caps),
                memory_bytes=caps,
                batch_size=self._batch_size,
            )
            placement = self._agent.place(
                task, mode=self._mode, num_samples=self._num_samples, seed=self._seed
            )
            self.last_report = getattr(self._agent, "last_report", None)
            return placement
        except ValueError as exc:  # PlacementError is a ValueError
            raise PlannerError(
                f"DreamShard could not place the tables: {exc}",
                PlannerErrorType.INSUFFICIENT_STORAGE,
            ) from exc

    def _check_fits(self, ours: list[ShardingOption], need: list[int], left: list[int]) -> None:
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
        misfits = [f"{o.fqn} ({n} bytes)" for o, n in zip(ours, need, strict=True) if n > biggest]
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
