"""Moving a table-wise table between the ranks of a live DMP job
(:func:`torchrec_dreamshard.feedback.reshard.apply_in_place`, TorchRec's
``DistributedModelParallel.reshard``) on 2 gloo CPU ranks: the table's rows and its Adagrad
state arrive unchanged on the new rank, the plan says so, and training goes on and updates
the table where it now is; and the changes it cannot apply in place are refused before
anything moves.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from torchrec_dreamshard.feedback.reshard import apply_in_place
from torchrec_dreamshard.ranks.spawn import exit_spawned_rank, free_port, local_process_group

WORLD = 2
ROWS = [20, 30, 40]
DIM = 8
BEFORE = {"t0": 0, "t1": 0, "t2": 1}
AFTER = {"t0": 0, "t1": 1, "t2": 1}  # t1 moves from rank 0 to rank 1


class Model(torch.nn.Module):
    """An EmbeddingBagCollection of three small tables under a linear head (dense parameters,
    so DMP wraps the model in DDP, which ``reshard`` expects)."""

    def __init__(self) -> None:
        from torchrec.modules.embedding_configs import EmbeddingBagConfig
        from torchrec.modules.embedding_modules import EmbeddingBagCollection

        super().__init__()
        tables = [
            EmbeddingBagConfig(
                name=f"t{i}", embedding_dim=DIM, num_embeddings=n, feature_names=[f"f{i}"]
            )
            for i, n in enumerate(ROWS)
        ]
        self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        self.head = torch.nn.Linear(DIM * len(ROWS), 1)

    def forward(self, kjt):
        return self.head(self.ebc(kjt).values())


def sharder():
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    fused = {"optimizer": EmbOptimType.EXACT_ADAGRAD, "learning_rate": 0.1}
    return EmbeddingBagCollectionSharder(fused_params=fused)


def plan(model: Model, place: dict[str, int], t0=None):
    """Every table table-wise on its rank in ``place`` (``t0``: another generator for t0)."""
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import ShardingPlan

    per_table = {n: table_wise(rank=r, compute_kernel="fused") for n, r in place.items()}
    if t0 is not None:
        per_table["t0"] = t0
    module_plan = construct_module_sharding_plan(
        model.ebc,
        per_table,
        sharder=sharder(),
        local_size=WORLD,
        world_size=WORLD,
        device_type="cpu",
    )
    return ShardingPlan({"ebc": module_plan})


def batch(rank: int, step: int):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(100 * rank + step)
    lengths = torch.randint(1, 4, (len(ROWS), 4), generator=g)
    values = [torch.randint(0, ROWS[t], (int(lengths[t].sum()),), generator=g) for t in range(3)]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{t}" for t in range(3)], values=torch.cat(values), lengths=lengths.flatten()
    )


def t1_state(dmp) -> tuple[torch.Tensor | None, torch.Tensor]:
    """t1's full weight gathered on rank 0 (None elsewhere) from its ShardedTensor, and its
    Adagrad ``momentum1`` from whichever rank holds it (the optimizer state lists local
    tables only)."""
    key = "ebc.embedding_bags.t1.weight"
    weight = dmp.state_dict()[key]
    full = torch.empty(weight.size()) if dist.get_rank() == 0 else None
    weight.gather(dst=0, out=full)
    momentum = dmp.fused_optimizer.state_dict()["state"].get(key, {}).get("t1.momentum1")
    local = None if momentum is None else momentum.local_shards()[0].tensor.clone()
    held = [None] * WORLD
    dist.all_gather_object(held, local)
    (state,) = [t for t in held if t is not None]
    return full, state


def move_worker(rank: int, port: int, out_dir: str) -> None:
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import column_wise
    from torchrec.distributed.types import ShardingEnv

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    with local_process_group(rank, WORLD, port):
        torch.manual_seed(0)
        model = Model()
        # plans are made of the unsharded model (DMP shards it in place)
        before, after = plan(model, BEFORE), plan(model, AFTER)
        split_t0 = plan(model, AFTER, t0=column_wise(ranks=[0, 1]))
        dmp = DistributedModelParallel(
            model,
            env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),
            device=torch.device("cpu"),
            plan=before,
            sharders=[sharder()],
        )

        def step(s: int) -> float:
            loss = dmp(batch(rank, s)).pow(2).mean()
            loss.backward()
            return float(loss)

        losses = [step(s) for s in range(2)]
        weight, momentum = t1_state(dmp)
        try:
            apply_in_place(dmp, split_t0, "ebc")
            refused = ""
        except ValueError as e:
            refused = str(e)
        after_text = str(after)
        moved = apply_in_place(dmp, after, "ebc")
        weight_after, momentum_after = t1_state(dmp)
        local = dmp.state_dict()["ebc.embedding_bags.t1.weight"].local_shards()
        losses += [step(s) for s in range(2, 4)]
        weight_later, momentum_later = t1_state(dmp)
        result = {
            "moved": moved,
            "refused": refused,
            "plan_ranks": dmp.plan.plan["ebc"]["t1"].ranks,
            # the plan moved to is not changed; the one the DMP was built with (and holds)
            # is: TorchRec's reshard writes the move into it
            "new_plan_unchanged": str(after) == after_text,
            "built_with_updated": dmp.plan is before and before.plan["ebc"]["t1"].ranks == [1],
            "holds_t1": bool(local),
            "momentum_equal": torch.equal(momentum, momentum_after),
            "momentum_sum": float(momentum.sum()),
            "losses": losses,
        }
        if rank == 0:
            result["weight_equal"] = torch.equal(weight, weight_after)
            # the moved table's new rank trains it: its rows and its Adagrad state change
            result["trained_after"] = not torch.equal(weight_after, weight_later)
            result["state_after"] = not torch.equal(momentum_after, momentum_later)
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
    exit_spawned_rank()


@pytest.mark.slow
def test_table_wise_move_keeps_rows_and_optimizer_state(tmp_path):
    mp.spawn(move_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert ranks[0]["weight_equal"]
    assert ranks[0]["trained_after"] and ranks[0]["state_after"]
    for rank, got in enumerate(ranks):
        assert got["moved"] == ["t1"]
        assert "['t0']" in got["refused"] and "restart path" in got["refused"]
        assert got["plan_ranks"] == [1]
        assert got["new_plan_unchanged"] and got["built_with_updated"]
        assert got["holds_t1"] == (rank == 1)
        assert got["momentum_equal"] and got["momentum_sum"] > 0
        assert len(got["losses"]) == 4 and all(math.isfinite(x) for x in got["losses"])


def test_unchanged_plan_moves_nothing_and_other_changes_are_refused():
    from torchrec.distributed.sharding_plan import table_wise

    model = Model()
    dmp = SimpleNamespace(plan=plan(model, BEFORE))
    assert apply_in_place(dmp, plan(model, BEFORE)) == []
    with pytest.raises(ValueError, match=r"\['t0'\].*restart path"):
        apply_in_place(dmp, plan(model, BEFORE, t0=table_wise(rank=0, compute_kernel="dense")))
    with pytest.raises(ValueError, match="not in both"):
        apply_in_place(dmp, plan(model, AFTER), "other")
