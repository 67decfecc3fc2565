"""What the planner reads off any search space (ours or a user's enumerator's): the
options the policy places, the tables it may split, a split's column-wise option, and the
layout of a plan.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchrec.distributed.planner.constants import MIN_CW_DIM
from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    PartitionByType,
    Shard,
    ShardingOption,
    Topology,
)
from torchrec.distributed.types import ShardingPlan

from torchrec_dreamshard.data.splits import split_counts
from torchrec_dreamshard.planner.adapters.device_memory import (
    device_capacity,
    memory_tier,
    option_bytes,
    storage_bytes,
)
from torchrec_dreamshard.planner.stages.option_kinds import (
    DREAMSHARD_COMPUTE_KERNEL,
    DREAMSHARD_SHARDING_TYPE,
    SPLIT_SHARDING_TYPE,
    is_policy_option,
    is_split_option,
)
from torchrec_dreamshard.planner.stages.option_specs import SpecFn


def by_table(search_space: Sequence[ShardingOption]) -> dict[str, list[ShardingOption]]:
    """The options of each table, by fully qualified name, in search-space order."""
    out: dict[str, list[ShardingOption]] = {}
    for option in search_space:
        out.setdefault(option.fqn, []).append(option)
    return out


def min_shard_width(constraints: dict[str, ParameterConstraints] | None, name: str) -> int:
    """Narrowest column-wise shard of table ``name``: its ``min_partition``, else
    TorchRec's ``MIN_CW_DIM``."""
    constraint = (constraints or {}).get(name)
    return int((constraint.min_partition if constraint else None) or MIN_CW_DIM)


def split_widths(
    search_space: Sequence[ShardingOption],
    constraints: dict[str, ParameterConstraints] | None,
    world_size: int,
    spec_fn: SpecFn,
) -> dict[str, int]:
    """Minimum shard width of every policy table the search space offers column-wise on
    the fused kernel with a shard count allowed, by fqn."""
    out: dict[str, int] = {}
    for fqn, options in by_table(search_space).items():
        mine = [o for o in options if is_policy_option(o)]
        if not mine or not any(is_split_option(o) for o in options):
            continue
        width = min_shard_width(constraints, mine[0].name)
        if split_counts(spec_fn(mine[0]), world_size, width):
            out[fqn] = width
    return out


def choose_options(
    search_space: Sequence[ShardingOption], constraint: Topology, widths: dict[str, int]
) -> tuple[list[ShardingOption], list[ShardingOption]]:
    """One option per table: the policy's (table-wise fused) where the table fits a device
    whole, may be split, or has no other option; else TorchRec's best-rated option among
    those whose every shard fits the largest device (then the best-rated of all)."""
    tier = memory_tier(constraint)
    biggest = max(device_capacity(constraint))

    def rank_key(o: ShardingOption) -> tuple[bool, float]:
        fits = all(storage_bytes(s.storage, tier) <= biggest for s in o.shards)
        return (not fits, o.total_perf)

    ours, others = [], []
    for fqn, options in by_table(search_space).items():
        mine = [o for o in options if is_policy_option(o)]
        rest = [o for o in options if not is_policy_option(o) and not is_split_option(o)]
        rest = rest or [o for o in options if not is_policy_option(o)]
        if mine and (not rest or fqn in widths or option_bytes(mine[0], tier) <= biggest):
            ours.append(mine[0])
        else:
            others.append(min(rest, key=rank_key))
    return ours, others


def column_wise_option(
    enumerator: Enumerator, option: ShardingOption, columns: Sequence[tuple[int, int]]
) -> ShardingOption:
    """The column-wise fused option of ``option``'s table cut at ``columns``, estimated by
    ``enumerator``, with ``option``'s constraint fields and no ranks."""
    rows = int(option.tensor.shape[0])
    split = ShardingOption(
        name=option.name,
        tensor=option.tensor,
        module=option.module,
        input_lengths=option.input_lengths,
        batch_size=option.batch_size,
        sharding_type=SPLIT_SHARDING_TYPE,
        partition_by=PartitionByType.DEVICE.value,
        compute_kernel=option.compute_kernel,
        shards=[Shard(size=[rows, b - a], offset=[0, a]) for a, b in columns],
        cache_params=option.cache_params,
        enforce_hbm=option.enforce_hbm,
        stochastic_rounding=option.stochastic_rounding,
        bounds_check_mode=option.bounds_check_mode,
        dependency=option.dependency,
        is_pooled=option.is_pooled,
        feature_names=option.feature_names,
        output_dtype=option.output_dtype,
        key_value_params=option.key_value_params,
    )
    enumerator.populate_estimates([split])
    return split


def plan_layout(plan: ShardingPlan) -> tuple[dict[str, int], dict[str, list[dict]]]:
    """By fqn, the rank of each fused table-wise table and the shards
    (``{"device": rank, "columns": [start, end]}``) of each fused column-wise one."""
    whole: dict[str, int] = {}
    shards: dict[str, list[dict]] = {}
    for path, module_plan in plan.plan.items():
        for name, ps in module_plan.items():  # type: ignore[union-attr]
            if ps.compute_kernel != DREAMSHARD_COMPUTE_KERNEL or ps.sharding_spec is None:
                continue
            fqn = f"{path}.{name}"
            if ps.sharding_type == DREAMSHARD_SHARDING_TYPE:
                whole[fqn] = int(ps.ranks[0])
            elif ps.sharding_type == SPLIT_SHARDING_TYPE:
                shards[fqn] = [
                    {"device": int(m.placement.rank()), "columns": [start, start + size]}
                    for m in ps.sharding_spec.shards
                    for start, size in [(int(m.shard_offsets[1]), int(m.shard_sizes[1]))]
                ]
    return whole, shards
