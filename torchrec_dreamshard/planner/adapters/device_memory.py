"""Device memory as TorchRec's planner counts it: the tier, each device's capacity there and
an option's storage on it."""

from __future__ import annotations

from collections.abc import Sequence

from torchrec.distributed.planner.types import ShardingOption, Storage, Topology


def memory_tier(topology: Topology) -> str:
    """``"hbm"`` on accelerators, ``"ddr"`` for a CPU compute device (TorchRec's rule)."""
    return "hbm" if topology.compute_device in ("cuda", "mtia") else "ddr"


def storage_bytes(storage: Storage | None, tier: str) -> int:
    """Bytes of ``storage`` on memory ``tier`` (0 when unknown)."""
    return 0 if storage is None else int(getattr(storage, tier))


def device_capacity(topology: Topology) -> list[int]:
    """Each device's capacity on the tier the tables live on, in bytes."""
    tier = memory_tier(topology)
    return [storage_bytes(d.storage, tier) for d in topology.devices]


def option_bytes(option: ShardingOption, tier: str) -> int:
    """Total storage of a sharding option on ``tier`` (TorchRec's storage estimate)."""
    return sum(storage_bytes(s.storage, tier) for s in option.shards)


def rank_bytes(options: Sequence[ShardingOption], world_size: int, tier: str) -> list[int]:
    """TorchRec's storage estimate of each rank's shards on memory ``tier``."""
    used = [0] * world_size
    for option in options:
        for shard in option.shards:
            if shard.rank is not None:
                used[shard.rank] += storage_bytes(shard.storage, tier)
    return used
