"""Which sharding types each table may take, and so which of the machine's models a plan
may need: the profile step measures a model only where some plan the type choice rates
could be priced by it.

A table may take the types its collection's sharder offers on the device (TorchRec
matches sharders to modules by module type: a sharder of another collection offers
nothing here) less what the table's ``ParameterConstraints.sharding_types`` rule out.
"""

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
    """Per embedding collection of ``module`` that one of ``sharders`` shards, its tables'
    configs, each with the types it may take on ``device``."""
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
    """Whether some table may take a type the type choice prices with the collective and
    dense-kernel models (data-parallel, row-wise, table-row-wise)."""
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
    """Whether the type choice may rate plans that run another number of sharding paths
    than every table table-wise, so that the cost of a path could move it: some table may
    take row-wise or table-row-wise (a path beside table-wise's), or every table of one
    collection may be data-parallel and their weights together fit the smallest device
    (then no table-wise path is left for that collection). Where neither holds, the
    sharding path is not timed: every plan the type choice rates pays the same paths."""
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
