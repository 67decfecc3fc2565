"""``DreamShardPartitioner``: TorchRec's partitioner places the tables the policy does not,
then the policy places its own in the memory left; every device's shards are checked
against TorchRec's storage reservation (docs/architecture.md, "The planner's components").
"""

from __future__ import annotations

import copy

from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.types import (
    Enumerator,
    Partitioner,
    PlannerError,
    PlannerErrorType,
    ShardingOption,
    Storage,
    Topology,
)

from torchrec_dreamshard.data.splits import plan_entries
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import placed_bytes
from torchrec_dreamshard.planner.adapters.device_memory import (
    device_capacity,
    memory_tier,
    option_bytes,
    rank_bytes,
    storage_bytes,
)
from torchrec_dreamshard.planner.adapters.planner_errors import readable_partition_error
from torchrec_dreamshard.planner.stages.option_specs import SpecFn, spec_for_option
from torchrec_dreamshard.planner.stages.placement import PolicyPlacer
from torchrec_dreamshard.planner.stages.proposal import DreamShardProposal
from torchrec_dreamshard.planner.stages.search_space import column_wise_option
from torchrec_dreamshard.policy.safety_net import SafetyReport
from torchrec_dreamshard.policy.split_search import SplitPlan

MAX_MEMORY_ROUNDS = 6  # policy placements before giving up on a device's memory
MEMORY_SHRINK = 0.97  # extra margin when a device's share is shrunk


class DreamShardPartitioner(Partitioner):
    """Places DreamShard's proposals; keeps the ranks of ranked ones; hands the others to
    the fallback.

    Args:
        fallback: places unranked proposals and the tables the policy does not place
            (``None``: TorchRec's ``GreedyPerfPartitioner`` for the latter).
        placer: the policy's placement (``None``: policy tables are an error).
        enumerator: estimates the column-wise options of split tables.
        spec_fn: the planner's table specs (default: shapes and pooling only).
    """

    def __init__(
        self,
        fallback: Partitioner | None = None,
        placer: PolicyPlacer | None = None,
        enumerator: Enumerator | None = None,
        spec_fn: SpecFn | None = None,
    ) -> None:
        self.fallback = fallback
        self.placer = placer
        self._enumerator = enumerator
        self._spec: SpecFn = spec_fn or spec_for_option

    @property
    def last_report(self) -> SafetyReport | None:
        """The safety net's report of the policy's last placement of whole tables."""
        return self.placer.last_report if self.placer is not None else None

    def partition(
        self, proposal: list[ShardingOption], storage_constraint: Topology
    ) -> list[ShardingOption]:
        """``proposal`` with a rank in every shard.

        Raises:
            PlannerError: the tables do not fit, a rank is out of range, or a device is
                over its storage (each named). Any other error raises as itself.
        """
        if isinstance(proposal, DreamShardProposal):
            plan = self._place(proposal, storage_constraint)
        elif self.fallback is not None and any(s.rank is None for o in proposal for s in o.shards):
            try:
                return self.fallback.partition(proposal, storage_constraint)
            except PlannerError as exc:
                what = "the partitioner could not place the proposal's tables"
                raise readable_partition_error(exc, proposal, storage_constraint, what) from exc
        else:
            plan = proposal
        check_ranks(plan, storage_constraint)
        return plan

    def _place(self, proposal: DreamShardProposal, constraint: Topology) -> list[ShardingOption]:
        if self.placer is not None:
            self.placer.forget_report()
        others, ours = proposal.other_options(), proposal.policy_options()
        used = self._place_others(others, constraint)
        left = [cap - u for cap, u in zip(device_capacity(constraint), used, strict=True)]
        if ours:
            ours = self._place_policy(ours, left, memory_tier(constraint), proposal.split_widths)
        return others + ours

    def _place_others(self, others: list[ShardingOption], constraint: Topology) -> list[int]:
        """Place the non-policy tables with TorchRec's partitioner; bytes per device."""
        if not others:
            return [0] * constraint.world_size
        try:
            (self.fallback or GreedyPerfPartitioner()).partition(others, copy.deepcopy(constraint))
        except PlannerError as exc:
            what = "TorchRec's partitioner could not place the tables DreamShard leaves to it"
            raise readable_partition_error(exc, others, constraint, what) from exc
        return rank_bytes(others, constraint.world_size, memory_tier(constraint))

    def _place_policy(
        self, ours: list[ShardingOption], left: list[int], tier: str, widths: dict[str, int]
    ) -> list[ShardingOption]:
        """The policy's options with ranks: shares shrink until TorchRec's estimate fits;
        TorchRec's own plan where the policy's still overflow."""
        if self.placer is None:
            raise PlannerError(
                "DreamShardPartitioner was given a proposal with policy tables and no "
                "placer to place them; give it a PolicyPlacer",
                PlannerErrorType.OTHER,
            )
        specs = [self._spec(o) for o in ours]
        need = [option_bytes(o, tier) for o in ours]
        check_fits(ours, need, left, widths)
        own = self.placer.torchrec_plan(specs, left) if min(left) > 0 else None
        caps = policy_caps(specs, need, left)
        if own is not None:  # the first shares admit TorchRec's plan
            floor = placed_bytes([t.size_bytes for t in specs], own, len(left))
            caps = [max(c, f) for c, f in zip(caps, floor, strict=True)]
        by_fqn = {o.fqn: (o, n) for o, n in zip(ours, need, strict=True)}
        for _ in range(MAX_MEMORY_ROUNDS):
            try:
                found = self.placer.place(specs, caps, widths)
            except PlannerError:  # the shares left no room: TorchRec's plan, if it has one
                if own is None:
                    raise
                break
            used, holders = self._storage_used(found, by_fqn, tier, len(left))
            over = [d for d, (u, cap) in enumerate(zip(used, left, strict=True)) if u > cap]
            if not over:
                return self._ranked_options(ours, found)
            whole, _ = plan_entries(found.sharded, found.placement)
            caps = shrunk_caps(caps, {d: (left[d], used[d]) for d in over}, specs, whole)
        if own is not None:  # TorchRec's own plan fits by TorchRec's own count
            return self._ranked_options(ours, self.placer.fixed(specs, caps, own))
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

    def _ranked_options(self, ours: list[ShardingOption], found: SplitPlan) -> list[ShardingOption]:
        """The options with the plan's ranks (a column-wise option per split table)."""
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
                "DreamShard split a table but its partitioner was given no enumerator to "
                "estimate the column-wise shards; give DreamShardPartitioner(enumerator=...)",
                PlannerErrorType.OTHER,
            )
        return column_wise_option(self._enumerator, option, columns)


def shrunk_caps(
    caps: list[int],
    over: dict[int, tuple[int, int]],
    specs: list[TableSpec],
    whole: dict[str, int],
) -> list[int]:
    """The policy's shares after an overflow: each device in ``over`` (memory left, estimate
    used) shrunk in proportion, never below a whole table there no other share holds."""
    out = list(caps)
    for d, (left, used) in over.items():
        out[d] = max(1, int(out[d] * max(left, 0) / used * MEMORY_SHRINK))
    for spec in specs:
        d = whole.get(spec.name)
        others = [c for k, c in enumerate(out) if k != d]
        if d is not None and d in over and spec.size_bytes > max(others, default=0):
            out[d] = max(out[d], spec.size_bytes)
    return out


def policy_caps(specs: list[TableSpec], need: list[int], left: list[int]) -> list[int]:
    """Each device's memory in weight bytes (``left`` times the weight-to-storage ratio); a
    table shut out of every cap, though its storage fits, raises the freest device's cap."""
    ratio = min(1.0, sum(t.size_bytes for t in specs) / max(1, sum(need)))
    caps = [max(1, int(room * ratio)) for room in left]
    shut_out = [
        (t.size_bytes, n) for t, n in zip(specs, need, strict=True) if t.size_bytes > max(caps)
    ]
    free = sorted(range(len(left)), key=lambda d: -left[d])
    for size, storage in sorted(shut_out, reverse=True):
        if free and storage <= left[free[0]]:
            d = free.pop(0)
            caps[d] = max(caps[d], size)
    return caps


def check_fits(
    ours: list[ShardingOption], need: list[int], left: list[int], widths: dict[str, int]
) -> None:
    """Raise ``PlannerError`` where the policy's tables cannot fit, in all or one by one."""
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


def check_ranks(plan: list[ShardingOption], storage_constraint: Topology) -> None:
    """Raise ``PlannerError`` for a missing or out-of-range rank, or a device over storage."""
    unranked = sorted({o.fqn for o in plan for s in o.shards if s.rank is None})
    if unranked:
        raise PlannerError(
            f"tables {unranked} have no rank: DreamShardPartitioner places DreamShardProposer's "
            "proposals and keeps the ranks other proposals carry; give it a fallback "
            "partitioner for proposals without ranks",
            PlannerErrorType.PARTITION,
        )
    world = storage_constraint.world_size
    bad = sorted({o.fqn for o in plan for s in o.shards if not 0 <= s.rank < world})
    if bad:
        raise PlannerError(
            f"tables {bad} have a rank outside 0..{world - 1}", PlannerErrorType.PARTITION
        )
    used = [Storage(hbm=0, ddr=0, ssd=0) for _ in storage_constraint.devices]
    tables: list[set[str]] = [set() for _ in storage_constraint.devices]
    for option in plan:
        for shard in option.shards:
            if shard.storage is not None:
                used[shard.rank] += shard.storage
            tables[shard.rank].add(option.fqn)
    for rank, device in enumerate(storage_constraint.devices):
        if not used[rank].fits_in(device.storage):
            raise PlannerError(
                f"rank {rank} is over its memory: its tables {sorted(tables[rank])} need "
                f"{used[rank]}, it has {device.storage} after TorchRec's storage "
                "reservation",
                PlannerErrorType.INSUFFICIENT_STORAGE,
            )
