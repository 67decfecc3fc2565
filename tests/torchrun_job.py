"""A TorchRec training job as a user writes it, launched by ``torchrun``:

    torchrun --nproc_per_node=2 tests/torchrun_job.py OUT_DIR

Each rank builds the same DLRM (embedding tables on the meta device), plans with the
default ``DreamShardPlanner`` (the bundled checkpoint, no flags) through
``collective_plan`` on the job's own process group, shards the model with
``DistributedModelParallel`` and trains a few steps. It writes ``OUT_DIR/rank<r>.json``:
the plan, the planner's stats on how it adapted to this machine, the planning time and the
losses. ``tests/test_torchrun.py`` launches it on an empty cache directory.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

DIM = 16  # TorchRec's DLRM takes one embedding dim for every table
TABLES = [  # (rows, mean ids per sample): tiny to medium, so every type is on offer
    (40, 1.0),
    (200, 2.0),
    (5_000, 3.0),
    (20_000, 4.0),
    (50_000, 2.0),
    (100_000, 1.0),
    (1_000, 6.0),
    (80_000, 8.0),
]
LOCAL_BATCH = 64
STEPS = 4


def build_model():
    """TorchRec's DLRM (:func:`~harness.dlrm_jobs.dlrm_train`) over
    :data:`TABLES`."""
    from harness.dlrm_jobs import dlrm_train, table_configs

    return dlrm_train(table_configs(TABLES, DIM))


def make_batch(rank: int, step: int):
    from harness.dlrm_jobs import poisson_batch

    return poisson_batch(TABLES, LOCAL_BATCH, rank, step)


def main(out_dir: Path, profile: str | None = None) -> None:
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from torchrec_dreamshard.planner import DreamShardPlanner

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = build_model()
    ebc = model.model.sparse_arch.embedding_bag_collection
    _apply_optimizer_in_backward(torch.optim.Adagrad, ebc.parameters(), {"lr": 0.05})
    sharders = [EmbeddingBagCollectionSharder()]
    start = time.perf_counter()
    # the topology of the job's group; with a profile, nothing measured
    planner = DreamShardPlanner(batch_size=LOCAL_BATCH, profile=profile)
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    plan_s = time.perf_counter() - start
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense = [p for n, p in dmp.named_parameters() if "embedding_bag" not in n]
    opt = torch.optim.SGD(dense, lr=0.05)
    losses = []
    for step in range(STEPS):
        loss, _ = dmp(make_batch(rank, step))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    module_plan = plan.plan["model.sparse_arch.embedding_bag_collection"]
    result = {
        "rank": rank,
        "plan": str(plan),
        "types": {name: ps.sharding_type for name, ps in module_plan.items()},
        "adaptation": planner.adaptation,
        "plan_s": plan_s,
        "losses": losses,
    }
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
    sys.stdout.flush()
    os._exit(0)  # see torchrec_dreamshard.ranks.spawn.exit_spawned_rank
