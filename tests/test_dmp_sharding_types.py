"""Every sharding type DreamShardPlanner emits on CPU ranks, trained under
DistributedModelParallel on 2 gloo ranks, and a weighted EmbeddingBagCollection planned and
trained the same way.

On CPU ranks TorchRec's ``EmbeddingBagCollectionSharder`` offers data-parallel, table-wise,
column-wise and table-column-wise. One DLRM (the six tables of
:mod:`test_planner_distributed`) has a table constrained to each, plus one left to
DreamShard's type choice; each rank plans with ``collective_plan``, trains a few steps and
writes what it got. The test checks that the plan has the type each table was given (and
splits the column-wise ones), that every rank got the same plan, that each rank's weights
are the shards the plan gave it, and that the loss stays finite.

Spawned ranks do not inherit conftest's monkeypatches: the planner is given the fixed
collective and dense-kernel models, and ``comm_model`` points every rank's cache (the
reference kernel's time) at ``tmp_path``.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import CPU_DENSE_LIKE, GLOO_LIKE
from test_planner_distributed import (
    DIM,
    LOCAL_BATCH,
    NUM_TABLES,
    STEPS,
    build_model,
    dlrm_train,
    make_batch,
    train_steps,
)

from torchrec_dreamshard.ranks.spawn import exit_spawned_rank, free_port, local_process_group

WORLD = 2
EBC = "model.sparse_arch.embedding_bag_collection"
HALF = DIM // 2  # min_partition of the split tables: two shards of DIM // 2 columns each

# the type each table is constrained to (t5 is left to DreamShard's type choice)
FORCED = {
    "t0": ["data_parallel"],
    "t1": ["table_wise"],
    "t2": ["table_wise"],
    "t3": ["column_wise"],
    "t4": ["table_column_wise"],
}
SPLIT = {"t3", "t4"}


def rows(name: str) -> int:
    """Rows of table ``t<i>`` in :func:`test_planner_distributed.build_model`."""
    return 50 * (int(name[1:]) + 1)


def constraints() -> dict:
    from torchrec.distributed.planner.types import ParameterConstraints

    return {
        name: ParameterConstraints(
            sharding_types=types, min_partition=HALF if name in SPLIT else None
        )
        for name, types in FORCED.items()
    }


def weighted_model():
    """The DLRM of :func:`test_planner_distributed.build_model` over a weighted
    EmbeddingBagCollection (its lookups are weighted sums)."""
    plain = build_model().model.sparse_arch.embedding_bag_collection
    return dlrm_train(plain.embedding_bag_configs(), is_weighted=True)


def make_weighted_batch(rank: int, step: int):
    """:func:`test_planner_distributed.make_batch` with a weight on every id."""
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    batch = make_batch(rank, step)
    kjt = batch.sparse_features
    g = torch.Generator().manual_seed(7000 + 1000 * rank + step)
    weighted = KeyedJaggedTensor.from_lengths_sync(
        keys=kjt.keys(),
        values=kjt.values(),
        lengths=kjt.lengths(),
        weights=torch.rand(kjt.values().numel(), generator=g),
    )
    return Batch(dense_features=batch.dense_features, sparse_features=weighted, labels=batch.labels)


def pooled_sums(dmp, rank: int) -> list[float]:
    """Sum of the absolute pooled embeddings of the sharded collection for one batch whose
    ids all weigh 0, then 1: 0, then not 0, when the weights reach every shard's lookup
    through the plan's input distribution."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    kjt = make_weighted_batch(rank, 0).sparse_features
    sharded = dmp.module.model.sparse_arch.embedding_bag_collection
    sums = []
    with torch.no_grad():
        for weight in (0.0, 1.0):
            ids = KeyedJaggedTensor.from_lengths_sync(
                keys=kjt.keys(),
                values=kjt.values(),
                lengths=kjt.lengths(),
                weights=torch.full((kjt.values().numel(),), weight),
            )
            sums.append(float(sharded(ids).values().abs().sum()))
    return sums


def local_weights(dmp) -> dict[str, list[list[list[int]]]]:
    """Each table's weights on this rank: ``[offsets, sizes]`` of every non-empty local
    shard (a replicated table: one shard, the whole table)."""
    out = {}
    for key, value in dmp.state_dict().items():
        if not (key.startswith(EBC) and key.endswith(".weight")):
            continue
        name = key.split(".")[-2]
        if hasattr(value, "local_shards"):
            out[name] = sorted(
                [list(s.metadata.shard_offsets), list(s.metadata.shard_sizes)]
                for s in value.local_shards()
                if s.tensor.numel() > 0
            )
        else:
            out[name] = [[[0, 0], list(value.shape)]]
    return out


def typed_planner(world: int, constraints: dict):
    """The planner these DMP tests plan with: an untrained agent (its placement is not what
    is tested), the CPU topology of ``world`` ranks, gloo-like collectives and a CPU-like
    dense kernel (no measuring), and ``constraints``."""
    from torchrec.distributed.planner.types import Topology

    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.policy import DreamShard

    return DreamShardPlanner(
        topology=Topology(world_size=world, compute_device="cpu"),
        batch_size=LOCAL_BATCH,
        agent=DreamShard.untrained(seed=0),
        constraints=constraints,
        collectives=GLOO_LIKE,
        dense_kernel=CPU_DENSE_LIKE,
    )


def assert_local_shards(tables: dict[str, dict], rank: int, local: dict) -> None:
    """``rank`` holds exactly the shards the plan gave it (a replicated table: all of it)."""
    for name, table in tables.items():
        if table["type"] == "data_parallel":
            expected = [[[0, 0], [rows(name), DIM]]]
        else:
            expected = sorted([off, size] for rk, off, size in table["shards"] if rk == rank)
        assert local.get(name, []) == expected, (rank, name, local.get(name))


def plan_tables(plan) -> dict[str, dict]:
    """Each table of the collection's plan: its type, ranks and ``[rank, offsets, sizes]``
    of every shard."""
    tables = {}
    for name, ps in plan.plan[EBC].items():
        shards = [] if ps.sharding_spec is None else ps.sharding_spec.shards
        tables[name] = {
            "type": ps.sharding_type,
            "ranks": ps.ranks,
            "shards": sorted(
                [s.placement.rank(), list(s.shard_offsets), list(s.shard_sizes)] for s in shards
            ),
        }
    return tables


def plan_and_train(rank: int, world: int, weighted: bool) -> dict:
    """Plan the model on every rank with ``collective_plan``, train it :data:`STEPS` steps
    under DMP, and say what this rank got."""
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    model = weighted_model() if weighted else build_model()
    ebc = model.model.sparse_arch.embedding_bag_collection
    _apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": 0.05})
    sharders = [EmbeddingBagCollectionSharder()]
    plan = typed_planner(world, constraints()).collective_plan(
        model, sharders, dist.GroupMember.WORLD
    )
    batch = make_weighted_batch if weighted else make_batch
    dmp, losses = train_steps(model, plan, sharders, lambda step: batch(rank, step))
    return {
        "plan": str(plan),
        "tables": plan_tables(plan),
        "local": local_weights(dmp),
        "losses": losses,
        "pooled": pooled_sums(dmp, rank) if weighted else None,
    }


def typed_worker(rank: int, world: int, port: int, out_dir: str, weighted: bool) -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    with local_process_group(rank, world, port):
        result = plan_and_train(rank, world, weighted)
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
    exit_spawned_rank()


def run_ranks(tmp_path: Path, weighted: bool) -> list[dict]:
    args = (WORLD, free_port(), str(tmp_path), weighted)
    mp.spawn(typed_worker, args=args, nprocs=WORLD, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert all(r["plan"] == results[0]["plan"] for r in results), "ranks got different plans"
    assert all(r["tables"] == results[0]["tables"] for r in results)
    return results


def check_types_and_weights(results: list[dict]) -> None:
    """Each forced table has its type (the split ones in two shards of :data:`HALF`
    columns), every rank holds the shards the plan gave it, and the loss is finite."""
    tables = results[0]["tables"]
    assert sorted(tables) == [f"t{i}" for i in range(NUM_TABLES)]
    for name, types in FORCED.items():
        assert tables[name]["type"] == types[0], (name, tables[name])
    assert tables["t0"]["shards"] == []  # replicated: no sharding spec
    for name in ("t1", "t2"):
        assert [s[1:] for s in tables[name]["shards"]] == [[[0, 0], [rows(name), DIM]]]
    for name in SPLIT:
        cols = sorted(offsets[1] for _, offsets, _ in tables[name]["shards"])
        assert cols == [0, HALF], (name, tables[name])  # every column, once
        assert all(size == [rows(name), HALF] for _, _, size in tables[name]["shards"])
    assert tables["t5"]["type"] in {"data_parallel", "table_wise"}  # the type choice's
    for r, res in enumerate(results):
        assert_local_shards(tables, r, res["local"])
        assert len(res["losses"]) == STEPS
        assert all(torch.isfinite(torch.tensor(res["losses"]))), res["losses"]


@pytest.mark.slow
@pytest.mark.usefixtures("comm_model")  # every rank's reference-kernel time from tmp_path
def test_every_cpu_sharding_type_trains_under_dmp(tmp_path):
    check_types_and_weights(run_ranks(tmp_path, weighted=False))


@pytest.mark.slow
@pytest.mark.usefixtures("comm_model")
def test_a_weighted_collection_trains_under_dmp_in_every_type(tmp_path):
    results = run_ranks(tmp_path, weighted=True)
    check_types_and_weights(results)
    for res in results:  # the ids' weights reach the sharded lookups
        zero, one = res["pooled"]
        assert zero == 0.0 and one > 0.0, res["pooled"]
