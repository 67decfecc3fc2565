"""Which sharding options the DreamShard policy places (table-wise and the column-wise
shards of its splits, on the fused kernel); TorchRec's partitioner places the rest.
"""

from __future__ import annotations

from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.types import ShardingOption
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

DREAMSHARD_SHARDING_TYPE: str = ShardingType.TABLE_WISE.value
DREAMSHARD_COMPUTE_KERNEL: str = EmbeddingComputeKernel.FUSED.value
SPLIT_SHARDING_TYPE: str = ShardingType.COLUMN_WISE.value


def is_dreamshard_option(option: ShardingOption) -> bool:
    """Whether the policy places this option (table-wise on the fused kernel)."""
    return (
        option.sharding_type == DREAMSHARD_SHARDING_TYPE
        and option.compute_kernel == DREAMSHARD_COMPUTE_KERNEL
    )


def is_policy_option(option: ShardingOption) -> bool:
    """Whether the policy can place ``option``: table-wise, fused, of an EBC table."""
    return is_dreamshard_option(option) and isinstance(option.module[1], EmbeddingBagCollection)


def is_split_option(option: ShardingOption) -> bool:
    """Whether ``option`` is a split the cost network rates: column-wise, fused, of an EBC."""
    return (
        option.sharding_type == SPLIT_SHARDING_TYPE
        and option.compute_kernel == DREAMSHARD_COMPUTE_KERNEL
        and isinstance(option.module[1], EmbeddingBagCollection)
    )
