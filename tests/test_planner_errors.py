"""An insufficient-storage ``PlannerError`` names the tables, their bytes and each device's
free bytes, never an object's repr, and keeps TorchRec's type and ``error_type``."""

from __future__ import annotations

import re

import pytest
import torch
from torchrec.distributed.planner.types import (
    ParameterConstraints,
    PlannerError,
    PlannerErrorType,
)
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from torchrec_dreamshard.planner.adapters.planner_errors import without_reprs
from torchrec_dreamshard.planner.adapters.topology import torchrec_topology

GROUP_REPR = (
    "can't find a host for sharding option group ShardingOptionGroup(sharding_options="
    "[<torchrec.distributed.planner.types.ShardingOption object at 0x7f85a1b2c3d0>], "
    "storage_sum=Storage(hbm=5253120, ddr=0, ssd=0), perf_sum=0.0111, param_count=-4)"
)


def test_without_reprs_keeps_the_bytes_and_drops_the_objects():
    text = without_reprs(GROUP_REPR)
    assert (
        text == "can't find a host for sharding option group of Storage(hbm=5253120, ddr=0, ssd=0)"
    )
    assert without_reprs("x <a.b.C object at 0xdeadbeef> y") == "x a sharding option y"


def test_tables_that_do_not_fit_a_gpu_cluster_are_named_with_their_bytes():
    """Four table-row-wise tables of 5 MB on 2 hosts of 2 GPUs of 5 MB each: TorchRec's
    partitioner fails on them (planned on this CPU-only machine, nothing measured)."""
    from torchrec_dreamshard.planner import DreamShardPlanner

    configs = [
        EmbeddingBagConfig(
            name=f"t{i}", num_embeddings=20_000, embedding_dim=64, feature_names=[f"f{i}"]
        )
        for i in range(4)
    ]
    model = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    planner = DreamShardPlanner(
        topology=torchrec_topology(4, "cuda", local_world_size=2, hbm_cap=5_000_000),
        batch_size=64,
        constraints={
            f"t{i}": ParameterConstraints(sharding_types=["table_row_wise"]) for i in range(4)
        },
        measure=False,
    )
    with pytest.raises(PlannerError) as err:
        planner.plan(model, get_default_sharders())
    message = str(err.value)
    assert err.value.error_type == PlannerErrorType.INSUFFICIENT_STORAGE
    assert "object at 0x" not in message and "ShardingOptionGroup(" not in message
    assert re.search(r"'\.t0' \(table_row_wise, \d{7} bytes\)", message)  # over 5 MB
    assert re.search(r"the 4 devices have \d+ bytes of hbm free each", message)
