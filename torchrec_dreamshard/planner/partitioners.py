"""``DreamShardPartitioner``: keeps the devices the proposer chose and checks memory.

TorchRec's ``GreedyPerfPartitioner`` assigns every shard a rank of its own choosing; the
DreamShard policy has already chosen them (``DreamShardProposer`` writes ``shard.rank``).
This partitioner keeps those ranks, checks that every shard has one, and that the shards on
each device fit the storage it has left after TorchRec's storage reservation.

Proposals that carry no ranks (those of a user's proposers, such as TorchRec's
``GreedyProposer``) go to the fallback partitioner (TorchRec's ``GreedyPerfPartitioner``, or
the user's ``partitioner``), as they would in TorchRec's planner. A proposal the DreamShard
proposer could not place is rejected with the proposer's error, which names the tables.
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

from torchrec_dreamshard.planner.proposers import DreamShardProposer


class DreamShardPartitioner(Partitioner):
    """Honours the proposer's ranks; raises ``PlannerError`` naming what does not fit.

    Args:
        fallback: partitions proposals without ranks (``None``: they are an error).
        proposer: the DreamShard proposer whose failed proposals are rejected with its
            error.
    """

    def __init__(
        self, fallback: Partitioner | None = None, proposer: DreamShardProposer | None = None
    ) -> None:
        self.fallback = fallback
        self.proposer = proposer

    def partition(
        self, proposal: list[ShardingOption], storage_constraint: Topology
    ) -> list[ShardingOption]:
        """Check ``proposal``'s ranks against ``storage_constraint`` and return it.

        Raises:
            PlannerError: the proposer could not place the proposal (its error), a shard
                has no rank (and there is no fallback) or a rank out of range, or a
                device's shards need more storage than it has (the device and its tables
                are named).
        """
        failure = self.proposer.failure(proposal) if self.proposer is not None else None
        if failure is not None:
            raise failure
        unranked = sorted({o.fqn for o in proposal for s in o.shards if s.rank is None})
        if unranked and self.fallback is not None:
            return self.fallback.partition(proposal, storage_constraint)
        if unranked:
            raise PlannerError(
                f"tables {unranked} have no rank: DreamShardPartitioner keeps the ranks "
                "its proposer wrote, use it with DreamShardProposer or give it a fallback "
                "partitioner",
                PlannerErrorType.PARTITION,
            )
        world = storage_constraint.world_size
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
