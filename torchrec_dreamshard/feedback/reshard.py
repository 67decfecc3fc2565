"""Move table-wise tables of a running job between ranks with TorchRec's ``DMP.reshard``
(process-independent tags on gloo, ``docs/torchrec_compatibility.md``); other changes restart."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

TABLE_WISE = "table_wise"


def table_moves(current: Any, new: Any) -> list[str]:
    """The tables whose only change between two module plans is a table-wise table's rank.

    Raises:
        ValueError: naming the tables with any other change.
    """
    moved, other = [], []
    for name in sorted(set(current) | set(new)):
        old, ps = current.get(name), new.get(name)
        if old is None or ps is None:
            other.append(name)
        elif old.ranks != ps.ranks and old.sharding_type == ps.sharding_type == TABLE_WISE:
            same_rest = dataclasses.replace(old, ranks=None, sharding_spec=None) == (
                dataclasses.replace(ps, ranks=None, sharding_spec=None)
            )
            (moved if same_rest else other).append(name)
        elif old != ps:
            other.append(name)
    if other:
        raise ValueError(
            f"tables {other} change other than by moving a table-wise table to another rank; "
            "only such moves can be applied in place, these need the restart path"
        )
    return moved


def apply_in_place(dmp: Any, new_plan: Any, module_path: str | None = None) -> list[str]:
    """Move the tables ``new_plan`` places on other ranks than ``dmp.plan`` does, keeping
    their weights and fused optimizer state; a collective, called alike on every rank.
    ``dmp.plan`` is updated in place (deep-copy it first to keep the old plan).

    Args:
        dmp: the job's ``DistributedModelParallel``.
        new_plan: a ``ShardingPlan`` (not changed).
        module_path: the sharded ``EmbeddingBagCollection`` (None: the plan's only module).

    Returns:
        The moved tables' names.

    Raises:
        ValueError: before moving anything, where a table changes other than by a
            table-wise rank move or the DMP cannot reshard the module.
    """
    from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
    from torchrec.distributed.types import EmbeddingModuleShardingPlan

    from torchrec_dreamshard.torchrec_compat import (
        dmp_wrapped_module,
        process_independent_reshard_tags,
    )

    if module_path is None:
        if len(new_plan.plan) != 1:
            raise ValueError(f"the plan has modules {sorted(new_plan.plan)}: name module_path")
        (module_path,) = new_plan.plan
    if module_path not in dmp.plan.plan or module_path not in new_plan.plan:
        raise ValueError(f"module {module_path!r} is not in both the DMP's plan and the new one")
    new = new_plan.plan[module_path]
    moved = table_moves(dmp.plan.plan[module_path], new)
    if not moved:
        return []
    sharded = dmp.module.get_submodule(module_path)
    if not isinstance(sharded, ShardedEmbeddingBagCollection):
        raise ValueError(
            f"{module_path!r} is a {type(sharded).__name__}; TorchRec reshards only "
            "ShardedEmbeddingBagCollection"
        )
    if not hasattr(dmp_wrapped_module(dmp), "module"):
        # reshard re-collects the fused optimizers from _dmp_wrapped_module.module (DDP's)
        raise ValueError("DMP.reshard needs a model with dense parameters wrapped in DDP")
    delta = EmbeddingModuleShardingPlan({name: copy.deepcopy(new[name]) for name in moved})
    with process_independent_reshard_tags():
        dmp.reshard({module_path: (0.0, delta)}, module_path)
    return moved
