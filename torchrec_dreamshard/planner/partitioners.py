"""``DreamShardPartitioner``: keeps the devices the proposer chose and checks memory.

TorchRec's ``GreedyPerfPartitioner`` assigns every shard a rank of its own choosing; the
DreamShard policy has already chosen them (``DreamShardProposer`` writes ``shard.rank``).
This partitioner keeps those ranks, checks that every shard has one, and that the shards on
each device fit the storage it has left after TorchRec's storage reservation.
"""

from __future__ import annotations

from torchrec.distributed.planner.types import (
    Partitioner,
    PlannerError,
    PlannerErrorType,
    ShardingOption,
    Storage,
    Topology,
)


class DreamShardPartitioner(Partitioner):
    """Honours the proposer's ranks; raises ``PlannerError`` naming what does not fit."""

    def partition(
        self, proposal: list[ShardingOption], storage_constraint: Topology
    ) -> list[ShardingOption]:
        """Check ``proposal``'s ranks against ``storage_constraint`` and return it.

        Raises:
            PlannerError: a shard has no rank or a rank out of range, or a device's shards
                need more storage than it has (the device and its tables are named).
        """
        world = storage_constraint.world_size
        unranked = sorted({o.fqn for o in proposal for s in o.shards if s.rank is None})
        if unranked:
            raise PlannerError(
                f"tables {unranked} have no rank: DreamShardPartitioner keeps the ranks "
                "its proposer wrote, use it with DreamShardProposer",
                PlannerErrorType.PARTITION,
            )
        bad = sorted({o.fqn for o in proposal for s in o.shards if not 0 <= s.rank < world})
        if bad:
            raise PlannerError(
                f"tables {bad} have a rank outside 0..{world - 1}", PlannerErrorType.PARTITION
            )
        self._check_storage(proposal, storage_constraint)
        return proposal

    @staticmethod
    def _check_storage(proposal: list[ShardingOption], storage_constraint: Topology) -> None:
        used = [Storage(hbm=0, ddr=0, ssd=0) for _ in storage_constraint.devices]
        tables: list[set[str]] = [set() for _ in storage_constraint.devices]
        for option in proposal:
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
