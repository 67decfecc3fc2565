"""Move tables of a running job between ranks without restarting it: a new plan's table-wise
rank moves applied to the live ``DistributedModelParallel`` with TorchRec's
``DistributedModelParallel.reshard``, which sends each moved table's weights and fused
optimizer state point to point from its old rank to its new one.

Only table-wise tables that keep everything but their rank can move this way; any other
change (sharding type, kernel, a table split or added) needs the restart path.

On gloo, TorchRec's reshard (1.8.0, 1.9.2) hangs as given: it tags each send and recv with
``hash((src, shard, local_shard, dst, table_name, is_optimizer))``
(``torchrec/distributed/sharding/dynamic_sharding.py``, ``_generate_tag``), and Python salts
the hash of a str per process, so the sender's and the receiver's tags differ unless every
rank started with the same ``PYTHONHASHSEED``. Gloo pairs a send with the recv of the same
tag, so both ranks wait forever in ``update_state_dictionaries`` (NCCL does not match tags,
which is why this works on GPUs). :func:`apply_in_place` gives TorchRec, for the duration of
the call, a tag that every process computes alike
(:func:`torchrec_dreamshard.torchrec_compat.process_independent_reshard_tags`, the package's
one patch of TorchRec, scoped to the call and under a lock).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

TABLE_WISE = "table_wise"


def table_moves(current: Any, new: Any) -> list[str]:
    """The tables whose only change from ``current`` to ``new`` (two module plans: table name
    to ``ParameterSharding``) is the rank of a table-wise table; a ``ValueError`` naming the
    tables with any other change."""
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
    """Move the tables that ``new_plan`` (a ``ShardingPlan``) places on other ranks than
    ``dmp``'s plan does, in the sharded ``EmbeddingBagCollection`` at ``module_path`` (None:
    the plan's only module), keeping their weights and fused optimizer state; returns the
    moved tables' names.

    Every rank must call it with the same plan (the move is a collective). Raises a
    ``ValueError`` before moving anything when a table changes other than by a table-wise
    rank move, or when the DMP cannot reshard that module.

    ``new_plan`` is not changed (the moves are copied from it); ``dmp.plan``, the
    ``ShardingPlan`` object the job built its DMP with, is: TorchRec's ``reshard`` writes
    the moved tables' new shardings into it, so that it describes the job as it now runs.
    Keep a ``copy.deepcopy`` of it first where the old plan is still wanted.
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
        # reshard re-collects the fused optimizers from _dmp_wrapped_module.module
        # (model_parallel.py, DistributedModelParallel.reshard), which only a DDP-wrapped
        # model has: one with dense parameters and init_data_parallel=True
        raise ValueError("DMP.reshard needs a model with dense parameters wrapped in DDP")
    delta = EmbeddingModuleShardingPlan({name: copy.deepcopy(new[name]) for name in moved})
    with process_independent_reshard_tags():
        dmp.reshard({module_path: (0.0, delta)}, module_path)
    return moved
