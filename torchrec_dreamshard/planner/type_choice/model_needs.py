"""Which sharding types each table may take (its collection's sharder's, less its
``ParameterConstraints``), and so which of the machine's models a plan may need."""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.types import ModuleSharder, ShardingType
from torchrec.modules.embedding_configs import BaseEmbeddingConfig

from torchrec_dreamshard.data.table_stats import collection_configs
from torchrec_dreamshard.planner.adapters.device_memory import device_capacity

# the sharding types whose pricing needs the collective and dense-kernel models
PRICED_TYPES = frozenset(
    {
        ShardingType.DATA_PARALLEL.value,
        ShardingType.ROW_WISE.value,
        ShardingType.TABLE_ROW_WISE.value,
    }
)
# types whose path a plan may run beside table-wise's: a sharding path's cost may move them
PATH_ADDING_TYPES = frozenset({ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value})
_FEWEST_BYTES_PER_WEIGHT = 2  # fp16: the path gate errs towards measuring


def collections_types(
    sharders: list[ModuleSharder[nn.Module]],
    module: nn.Module,
    constraints: dict[str, ParameterConstraints] | None,
    device: str,
) -> Iterator[list[tuple[BaseEmbeddingConfig, set[str]]]]:
    """Per sharded embedding collection of ``module``, its tables' configs and their types."""
    by_type = {sharder.module_type: sharder for sharder in sharders}
    constraints = constraints or {}
    for collection in module.modules():
        sharder = by_type.get(type(collection))
        configs = collection_configs(collection)
        if sharder is None or not configs:
            continue
        offered = set(sharder.sharding_types(device))
        tables = []
        for config in configs:
            types = getattr(constraints.get(config.name), "sharding_types", None)
            tables.append((config, offered if types is None else offered & set(types)))
        yield tables


def offers_priced_types(
    sharders: list[ModuleSharder[nn.Module]],
    module: nn.Module,
    constraints: dict[str, ParameterConstraints] | None,
    device: str,
) -> bool:
    """Whether some table may take data-parallel, row-wise or table-row-wise."""
    return any(
        allowed & PRICED_TYPES
        for tables in collections_types(sharders, module, constraints, device)
        for _, allowed in tables
    )


def sharding_paths_may_change(
    sharders: list[ModuleSharder[nn.Module]],
    module: nn.Module,
    constraints: dict[str, ParameterConstraints] | None,
    topology: Topology,
) -> bool:
    """Whether a rated plan may run another number of sharding paths than all-table-wise
    (some table may leave table-wise, or a whole collection may go data-parallel)."""
    smallest = min(device_capacity(topology), default=0)
    device = topology.compute_device
    for tables in collections_types(sharders, module, constraints, device):
        if any(allowed & PATH_ADDING_TYPES for _, allowed in tables):
            return True
        every_dp = all(ShardingType.DATA_PARALLEL.value in allowed for _, allowed in tables)
        weights = sum(config.num_embeddings * config.embedding_dim for config, _ in tables)
        if every_dp and weights * _FEWEST_BYTES_PER_WEIGHT <= smallest:
            return True
    return False
