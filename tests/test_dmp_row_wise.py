"""Row-wise and table-row-wise plans of DreamShardPlanner, trained under
DistributedModelParallel on 2 gloo ranks.

TorchRec's ``EmbeddingBagCollectionSharder`` offers row-wise and table-row-wise only on
CUDA (and MTIA) devices, so on CPU ranks no plan of those types is ever made or trained.
:class:`RowWiseOnCpuSharder` is TorchRec's sharder that also offers them on CPU. The DLRM
of :mod:`test_planner_distributed` has two tables constrained to row-wise and two to
table-row-wise (the other two are left to DreamShard); each rank plans with
``collective_plan``, trains a few steps and writes what it got. The test checks that the
plan has the type each table was given, with rows split between the ranks (every row
once), that each rank's local shards are the row ranges the plan gave it, that training
updated each rank's rows of those tables, and that the loss stays finite.

Spawned ranks do not inherit conftest's monkeypatches: the planner is given the fixed
collective and dense-kernel models, and ``comm_model`` writes every rank's cached
reference-kernel time in the test's own cache.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_dmp_sharding_types import (
    EBC,
    assert_local_shards,
    local_weights,
    plan_tables,
    rows,
    typed_planner,
)
from test_planner_distributed import (
    DIM,
    NUM_TABLES,
    STEPS,
    build_model,
    make_batch,
)
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ShardingType

from torchrec_dreamshard.ranks.spawn import exit_spawned_rank, free_port, local_process_group

WORLD = 2
ROW_TYPES = [ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value]
# the type each table is constrained to (t4 and t5 are left to DreamShard's type choice)
FORCED = {
    "t0": "row_wise",
    "t1": "row_wise",
    "t2": "table_row_wise",
    "t3": "table_row_wise",
}


class RowWiseOnCpuSharder(EmbeddingBagCollectionSharder):
    """TorchRec's ``EmbeddingBagCollectionSharder`` that also offers row-wise and
    table-row-wise sharding on CPU devices (TorchRec's offers them on CUDA only)."""

    def sharding_types(self, compute_device_type: str) -> list[str]:
        types = super().sharding_types(compute_device_type)
        if compute_device_type == "cpu":
            types += [t for t in ROW_TYPES if t not in types]
        return types


def test_the_test_sharder_offers_row_wise_on_cpu_where_torchrec_s_does_not():
    theirs = EmbeddingBagCollectionSharder().sharding_types("cpu")
    ours = RowWiseOnCpuSharder().sharding_types("cpu")
    assert not set(ROW_TYPES) & set(theirs)  # why the test sharder exists
    assert ours == theirs + ROW_TYPES
    cuda = EmbeddingBagCollectionSharder().sharding_types("cuda")
    assert RowWiseOnCpuSharder().sharding_types("cuda") == cuda


def constraints() -> dict:
    from torchrec.distributed.planner.types import ParameterConstraints

    return {name: ParameterConstraints(sharding_types=[kind]) for name, kind in FORCED.items()}


def plan_and_train(rank: int, world: int) -> dict:
    """Plan the model on every rank with ``collective_plan`` and the test sharder, train it
    :data:`STEPS` steps under DMP, and say what this rank got."""
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.distributed.model_parallel import DistributedModelParallel

    model = build_model()
    ebc = model.model.sparse_arch.embedding_bag_collection
    _apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": 0.05})
    sharders = [RowWiseOnCpuSharder()]
    plan = typed_planner(world, constraints()).collective_plan(
        model, sharders, dist.GroupMember.WORLD
    )
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    start = local_rows(dmp)
    dense = [p for n, p in dmp.named_parameters() if "embedding_bag" not in n]
    opt = torch.optim.SGD(dense, lr=0.05)
    losses = []
    for step in range(STEPS):
        loss, _ = dmp(make_batch(rank, step))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    # the fused optimizer updated this rank's rows of every row-split table
    trained = {name: not torch.equal(rows, local_rows(dmp)[name]) for name, rows in start.items()}
    return {
        "plan": str(plan),
        "tables": plan_tables(plan),
        "local": local_weights(dmp),
        "trained": trained,
        "losses": losses,
    }


def local_rows(dmp) -> dict[str, torch.Tensor]:
    """This rank's shard of each table of :data:`FORCED` (a copy)."""
    out = {}
    for name in FORCED:
        (shard,) = dmp.state_dict()[f"{EBC}.embedding_bags.{name}.weight"].local_shards()
        out[name] = shard.tensor.detach().clone()
    return out


def row_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    with local_process_group(rank, world, port):
        result = plan_and_train(rank, world)
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
    exit_spawned_rank()


@pytest.mark.slow
@pytest.mark.usefixtures("comm_model")  # every rank's reference-kernel time, fixed
def test_row_wise_and_table_row_wise_plans_train_under_dmp(tmp_path):
    mp.spawn(row_worker, args=(WORLD, free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert all(r["plan"] == results[0]["plan"] for r in results), "ranks got different plans"
    tables = results[0]["tables"]
    assert sorted(tables) == [f"t{i}" for i in range(NUM_TABLES)]
    for name, kind in FORCED.items():
        table = tables[name]
        assert table["type"] == kind, (name, table)
        # rows split between the two ranks, every row once, every column in each shard
        assert sorted(rank for rank, _, _ in table["shards"]) == list(range(WORLD)), table
        spans = sorted((off[0], off[0] + size[0]) for _, off, size in table["shards"])
        assert spans[0][0] == 0 and spans[-1][1] == rows(name), (name, spans)
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False)), spans
        assert all(off[1] == 0 and size[1] == DIM for _, off, size in table["shards"])
    for r, res in enumerate(results):
        assert_local_shards(tables, r, res["local"])
        assert all(res["trained"].values()), (r, res["trained"])
        assert len(res["losses"]) == STEPS
        assert all(torch.isfinite(torch.tensor(res["losses"]))), res["losses"]
