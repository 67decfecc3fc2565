"""DreamShardPlanner's plan under DistributedModelParallel on 2 and 4 gloo ranks (CPU),
including a table too big for any single device that the planner splits column-wise.

Each rank builds the same DLRM (embedding tables on the meta device), gets the plan from
``collective_plan``, shards the model with ``DistributedModelParallel`` and trains a few
steps. The test checks that every rank received the same plan, that each table's weights
live on the rank the policy chose, and that the loss stays finite.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from torchrec_dreamshard.ranks.spawn import exit_spawned_rank, free_port, local_process_group

NUM_TABLES = 6
DIM = 8
LOCAL_BATCH = 8
STEPS = 3


def build_model():
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=DIM, num_embeddings=50 * (i + 1), feature_names=[f"f{i}"]
        )
        for i in range(NUM_TABLES)
    ]
    return dlrm_train(tables)


def dlrm_train(tables, is_weighted: bool = False):
    """The tests' one DLRM over meta-device ``tables``
    (:func:`harness.dlrm_jobs.dlrm_train`)."""
    from harness import dlrm_jobs

    return dlrm_jobs.dlrm_train(tables, is_weighted)


def make_batch(rank: int, step: int):
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(1000 * rank + step)
    lengths = torch.randint(1, 4, (NUM_TABLES * LOCAL_BATCH,), generator=g)
    values = torch.cat(
        [
            torch.randint(0, 50 * (i + 1), (int(n),), generator=g)
            for i in range(NUM_TABLES)
            for n in lengths[i * LOCAL_BATCH : (i + 1) * LOCAL_BATCH]
        ]
    )
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(NUM_TABLES)], values=values, lengths=lengths
    )
    return Batch(
        dense_features=torch.randn(LOCAL_BATCH, 4, generator=g),
        sparse_features=kjt,
        labels=torch.randint(0, 2, (LOCAL_BATCH,), generator=g).float(),
    )


def local_tables(dmp) -> list[str]:
    """Tables with a non-empty local shard on this rank."""
    out = []
    for key, value in dmp.state_dict().items():
        if key.endswith(".weight") and hasattr(value, "local_shards"):
            if any(s.tensor.numel() > 0 for s in value.local_shards()):
                out.append(key.split(".")[-2])
    return sorted(out)


def worker(rank: int, world: int, port: int, out_dir: str, split: bool = False) -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    with local_process_group(rank, world, port):
        (train_split if split else train)(rank, world, Path(out_dir))
    exit_spawned_rank()


def train_steps(model, plan, sharders, batch):
    """``model`` under DistributedModelParallel with ``plan``, trained :data:`STEPS` steps
    on ``batch(step)`` (SGD on the dense part; the embeddings' optimizer is fused in the
    backward): the DMP module and the losses."""
    from torchrec.distributed.model_parallel import DistributedModelParallel

    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense = [p for n, p in dmp.named_parameters() if "embedding_bag" not in n]
    opt = torch.optim.SGD(dense, lr=0.05)
    losses = []
    for step in range(STEPS):
        loss, _ = dmp(batch(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return dmp, losses


def train(rank: int, world: int, out_dir: Path) -> None:
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import ParameterConstraints, Topology

    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.policy import DreamShard

    model = build_model()
    ebc = model.model.sparse_arch.embedding_bag_collection
    _apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": 0.05})
    sharders = [EmbeddingBagCollectionSharder()]
    # table-wise only: the policy places every table, whatever this machine's collectives
    # and dense kernel would make of replicating these tiny ones (test_step_time trains
    # DreamShardPlanner's typed plans under DMP)
    table_wise = ParameterConstraints(sharding_types=["table_wise"])
    planner = DreamShardPlanner(
        topology=Topology(world_size=world, compute_device="cpu"),
        batch_size=LOCAL_BATCH,
        agent=DreamShard.untrained(seed=0),
        constraints={f"t{i}": table_wise for i in range(NUM_TABLES)},
    )
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    dmp, losses = train_steps(model, plan, sharders, lambda step: make_batch(rank, step))
    module_plan = plan.plan["model.sparse_arch.embedding_bag_collection"]
    result = {
        "plan": str(plan),
        "ranks": {name: ps.ranks for name, ps in module_plan.items()},
        "types": {name: ps.sharding_type for name, ps in module_plan.items()},
        "policy": planner.last_placement,  # rank 0 planned, every rank has it
        "prediction": None if planner.last_prediction is None else planner.last_prediction.step_ms,
        "local": local_tables(dmp),
        "losses": losses,
    }
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.another_size)])
def test_dlrm_trains_under_dmp_with_dreamshard_plan(world, tmp_path):
    mp.spawn(worker, args=(world, free_port(), str(tmp_path)), nprocs=world, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    assert all(r["plan"] == results[0]["plan"] for r in results), "ranks got different plans"
    ranks = results[0]["ranks"]
    assert sorted(ranks) == [f"t{i}" for i in range(NUM_TABLES)]
    assert set(results[0]["types"].values()) == {"table_wise"}
    policy = results[0]["policy"]
    assert all(r["policy"] == policy and r["prediction"] is not None for r in results)
    assert len({r["prediction"] for r in results}) == 1
    prefix = "model.sparse_arch.embedding_bag_collection."
    assert {name: [policy[prefix + name]] for name in ranks} == ranks
    for r, res in enumerate(results):
        assert res["local"] == sorted(n for n, rk in ranks.items() if rk == [r]), r
        assert len(res["losses"]) == STEPS
        assert all(torch.isfinite(torch.tensor(res["losses"])))


# -- failures reach every rank ----------------------------------------------------------


def failing_worker(rank: int, world: int, port: int, out_dir: str, checkpoint: str) -> None:
    """Rank 1 lacks the checkpoint; then rank 0 alone fails to plan (no memory)."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import PlannerError, Topology

    from torchrec_dreamshard.planner import DreamShardPlanner

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    report = {}
    with local_process_group(rank, world, port):
        sharders = [EmbeddingBagCollectionSharder()]
        topology = Topology(world_size=world, compute_device="cpu")
        mine = checkpoint if rank == 0 else checkpoint + ".missing"
        try:
            planner = DreamShardPlanner(topology=topology, batch_size=LOCAL_BATCH, checkpoint=mine)
            planner.collective_plan(build_model(), sharders, dist.GroupMember.WORLD)
        except Exception as exc:
            report["load"] = f"{type(exc).__name__}: {exc}"
        tiny = Topology(world_size=world, compute_device="cpu", ddr_cap=1000, hbm_cap=1000)
        planner = DreamShardPlanner(topology=tiny, batch_size=LOCAL_BATCH, checkpoint=checkpoint)
        try:
            planner.collective_plan(build_model(), sharders, dist.GroupMember.WORLD)
        except PlannerError as exc:
            report["plan"] = f"{type(exc).__name__}: {exc}"
            report["error_type"] = exc.error_type.name
    (Path(out_dir) / f"fail{rank}.json").write_text(json.dumps(report))
    exit_spawned_rank()


@pytest.mark.slow
def test_a_failure_on_one_rank_reaches_every_rank(tmp_path):
    """No rank is left waiting: every rank returns (a hang would never reach the asserts;
    how long planning takes is the benchmarks')."""
    from torchrec_dreamshard.policy import DreamShard
    from torchrec_dreamshard.policy.checkpoint import save_checkpoint

    checkpoint = str(tmp_path / "agent.pt")
    save_checkpoint(DreamShard.untrained(seed=0), checkpoint)
    args = (2, free_port(), str(tmp_path), checkpoint)
    mp.spawn(failing_worker, args=args, nprocs=2, join=True)
    reports = [json.loads((tmp_path / f"fail{r}.json").read_text()) for r in range(2)]
    for report in reports:
        assert report["load"].startswith("ValueError: rank 1: checkpoint"), report
        assert "agent.pt.missing" in report["load"] and "does not exist" in report["load"]
        assert "PlannerError" in report["plan"], report
        assert report["error_type"] == "INSUFFICIENT_STORAGE"  # TorchRec's type, on every rank
    assert "rank 0 could not plan" in reports[1]["plan"]


def place_with_a_bug(task) -> list[int]:
    """What rank 0's agent runs: a bug of its own, not a placement that does not fit."""
    raise ValueError(f"placement has {len(task.tables) - 1} entries for {len(task.tables)} tables")


def error_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Rank 0's agent raises a ``ValueError`` inside placement; every rank records what
    ``collective_plan`` raised on it."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import ParameterConstraints, Topology

    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.policy import DreamShard

    class BuggyAgent(DreamShard):
        def place(self, task, *args, **kwargs):
            return place_with_a_bug(task)

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    report = {}
    with local_process_group(rank, world, port):
        agent = (BuggyAgent if rank == 0 else DreamShard).untrained(seed=0)
        table_wise = ParameterConstraints(sharding_types=["table_wise"])
        planner = DreamShardPlanner(
            topology=Topology(world_size=world, compute_device="cpu"),
            batch_size=LOCAL_BATCH,
            agent=agent,
            constraints={f"t{i}": table_wise for i in range(NUM_TABLES)},
            calibrate=False,
            verify=0,
        )
        try:
            planner.collective_plan(build_model(), [EmbeddingBagCollectionSharder()])
        except Exception as exc:
            report = {"type": type(exc).__name__, "message": str(exc)}
    (Path(out_dir) / f"error{rank}.json").write_text(json.dumps(report))
    exit_spawned_rank()


@pytest.mark.slow
def test_rank0s_value_error_reaches_rank1_with_its_type_and_traceback(tmp_path, comm_model):
    """A ``ValueError`` raised inside rank 0's placement is not a placement that does not
    fit: TorchRec's loop does not skip it, and it reaches rank 1 as a ``ValueError`` whose
    message holds rank 0's message and traceback (the placer's frame and the agent's)."""
    mp.spawn(error_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    reports = [json.loads((tmp_path / f"error{r}.json").read_text()) for r in range(2)]
    for report in reports:
        assert report["type"] == "ValueError", report
        text = report["message"]
        assert text.startswith("rank 0 could not plan: ValueError: placement has 5 entries")
        assert "rank 0's traceback:\nTraceback (most recent call last):" in text
        assert "in place_with_a_bug" in text and "planner/stages/placement.py" in text
        assert "insufficient storage" not in text.lower()
    assert reports[0]["message"] == reports[1]["message"]


# -- a table too big for any single device, split column-wise ----------------------------

BIG_ROWS = 40_000  # 1.28 MB of weights: more than a device's 1.1 MB, half of it fits
SPLIT_CAP = 1_100_000  # bytes of DDR per device


def build_split_model():
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=DIM, num_embeddings=50 * (i + 1), feature_names=[f"f{i}"]
        )
        for i in range(NUM_TABLES - 1)
    ]
    tables.append(
        EmbeddingBagConfig(
            name="big", embedding_dim=DIM, num_embeddings=BIG_ROWS, feature_names=["fbig"]
        )
    )
    return dlrm_train(tables)


def make_split_batch(rank: int, step: int):
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(1000 * rank + step)
    rows = [50 * (i + 1) for i in range(NUM_TABLES - 1)] + [BIG_ROWS]
    lengths = torch.randint(1, 4, (NUM_TABLES * LOCAL_BATCH,), generator=g)
    values = torch.cat(
        [
            torch.randint(0, rows[i], (int(n),), generator=g)
            for i in range(NUM_TABLES)
            for n in lengths[i * LOCAL_BATCH : (i + 1) * LOCAL_BATCH]
        ]
    )
    keys = [f"f{i}" for i in range(NUM_TABLES - 1)] + ["fbig"]
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)
    return Batch(
        dense_features=torch.randn(LOCAL_BATCH, 4, generator=g),
        sparse_features=kjt,
        labels=torch.randint(0, 2, (LOCAL_BATCH,), generator=g).float(),
    )


def train_split(rank: int, world: int, out_dir: Path) -> None:
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import ParameterConstraints, Topology

    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.policy import DreamShard

    model = build_split_model()
    ebc = model.model.sparse_arch.embedding_bag_collection
    _apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": 0.05})
    sharders = [EmbeddingBagCollectionSharder()]
    planner = DreamShardPlanner(
        topology=Topology(world_size=world, compute_device="cpu", ddr_cap=SPLIT_CAP),
        batch_size=LOCAL_BATCH,
        agent=DreamShard.untrained(seed=0),
        constraints={
            "big": ParameterConstraints(min_partition=4),
            # the small tables table-wise, as in train(): what is tested is the split
            **{
                f"t{i}": ParameterConstraints(sharding_types=["table_wise"])
                for i in range(NUM_TABLES - 1)
            },
        },
    )
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    dmp, losses = train_steps(model, plan, sharders, lambda step: make_split_batch(rank, step))
    module_plan = plan.plan["model.sparse_arch.embedding_bag_collection"]
    big = dmp.state_dict()["model.sparse_arch.embedding_bag_collection.embedding_bags.big.weight"]
    result = {
        "plan": str(plan),
        "ranks": {name: ps.ranks for name, ps in module_plan.items()},
        "types": {name: ps.sharding_type for name, ps in module_plan.items()},
        "shards": planner.last_shards,
        "big_local": [
            [list(s.metadata.shard_offsets), list(s.metadata.shard_sizes)]
            for s in big.local_shards()
        ],  # fmt: skip
        "losses": losses,
    }
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))


@pytest.mark.slow
def test_dlrm_trains_with_a_table_split_column_wise(tmp_path):
    world = 2
    assert BIG_ROWS * DIM * 4 > SPLIT_CAP  # the table fits no single device whole
    mp.spawn(worker, args=(world, free_port(), str(tmp_path), True), nprocs=world, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    assert all(r["plan"] == results[0]["plan"] for r in results), "ranks got different plans"
    types, ranks = results[0]["types"], results[0]["ranks"]
    assert types["big"] == "column_wise"
    assert all(types[f"t{i}"] == "table_wise" for i in range(NUM_TABLES - 1))
    shards = results[0]["shards"]["model.sparse_arch.embedding_bag_collection.big"]
    assert all(r["shards"] == results[0]["shards"] for r in results)
    assert ranks["big"] == [s["device"] for s in shards] and sorted(ranks["big"]) == [0, 1]
    cols = sorted(s["columns"] for s in shards)
    assert cols == [[0, DIM // 2], [DIM // 2, DIM]]  # every column exactly once
    for r, res in enumerate(results):
        mine = [s["columns"] for s in shards if s["device"] == r]
        local = [[off[1], off[1] + size[1]] for off, size in res["big_local"] if size[1] > 0]
        assert local == mine, r  # rank r holds the columns the plan gave it
        for _, size in res["big_local"]:
            assert size[0] == BIG_ROWS and size[1] * BIG_ROWS * 4 <= SPLIT_CAP
        assert len(res["losses"]) == STEPS
        assert all(torch.isfinite(torch.tensor(res["losses"])))
