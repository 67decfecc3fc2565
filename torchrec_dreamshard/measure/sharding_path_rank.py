"""One rank of the sharding-path measurement (:mod:`.sharding_path`), run as ``python -m
torchrec_dreamshard.measure.sharding_path_rank JOB_JSON``."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from torchrec_dreamshard.measure.dmp_training import sharded_for_training, timed_steps
from torchrec_dreamshard.measure.rounds import balanced_order, measure_in_rounds
from torchrec_dreamshard.ranks.spawn import exit_spawned_rank, local_process_group
from torchrec_dreamshard.threads import single_thread

PLANS = ("data_parallel", "one_table_wise")  # the two plans, in the measurement's order
LR = 0.01


class PathModel(nn.Module):
    """The path tables (``(rows, dim, ids per bag)`` each, fed by ``f<i>``) pooled, then a
    linear layer; ``forward(kjt)`` returns the summed output as the loss."""

    def __init__(self, tables: list[list[int]], device: torch.device) -> None:
        from torchrec.modules.embedding_configs import EmbeddingBagConfig
        from torchrec.modules.embedding_modules import EmbeddingBagCollection

        super().__init__()
        configs = [
            EmbeddingBagConfig(
                name=f"t{i}", embedding_dim=dim, num_embeddings=rows, feature_names=[f"f{i}"]
            )
            for i, (rows, dim, _) in enumerate(tables)
        ]
        self.sparse = EmbeddingBagCollection(tables=configs, device=device)
        self.dense = nn.Linear(sum(dim for _, dim, _ in tables), 1, device=device)

    def forward(self, kjt) -> torch.Tensor:
        return self.dense(self.sparse(kjt).values()).sum()


def path_plan(model: PathModel, kind: str, world: int, local: int, device_type: str):
    """Every table data-parallel, or (``one_table_wise``) the first table-wise on rank 0,
    over ``world`` ranks of ``local`` per host."""
    from torchrec.distributed.sharding_plan import (
        construct_module_sharding_plan,
        data_parallel,
        table_wise,
    )
    from torchrec.distributed.types import ShardingPlan

    names = [c.name for c in model.sparse.embedding_bag_configs()]
    per_table = {
        n: table_wise(rank=0) if kind == "one_table_wise" and i == 0 else data_parallel()
        for i, n in enumerate(names)
    }
    module_plan = construct_module_sharding_plan(
        model.sparse,
        per_param_sharding=per_table,
        local_size=local,
        world_size=world,
        device_type=device_type,
    )
    return ShardingPlan({"sparse": module_plan})


def path_batch(tables: list[list[int]], batch: int, seed: int):
    """A batch of ``batch`` samples: ``ids per bag`` uniform ids of each table per sample."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(seed)
    lengths = torch.cat([torch.full((batch,), bag, dtype=torch.int32) for _, _, bag in tables])
    values = torch.cat(
        [torch.randint(rows, (batch * bag,), generator=g) for rows, _, bag in tables]
    )
    keys = [f"f{i}" for i in range(len(tables))]
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)


def run_path_rounds(
    job: dict[str, Any],
    group: dist.ProcessGroup | None = None,
    device: torch.device | None = None,
    local: int | None = None,
) -> dict[str, list[float]]:
    """Both plans' mean step ms in each of ``job["rounds"]`` interleaved rounds, run by every
    rank of ``group`` (``local`` ranks per host) on ``device`` (default CPU, one thread)."""
    device = device or torch.device("cpu")
    world = dist.get_world_size(group)
    tables = job["tables"]
    with single_thread(device.type == "cpu"):
        models = {}
        for kind in PLANS:
            model = PathModel(tables, torch.device("meta"))
            plan = path_plan(model, kind, world, local or world, device.type)
            models[kind] = sharded_for_training(model, plan, LR, ("sparse.",), group, device)
        batch = path_batch(tables, job["batch_size"], seed=dist.get_rank(group)).to(device)
        times: dict[str, list[float]] = {k: [] for k in PLANS}

        def step(kind: str) -> None:
            dmp, optimizer = models[kind]
            optimizer.zero_grad()
            dmp(batch).backward()
            optimizer.step()

        def measure(_: int, kind: str) -> float:
            return timed_steps(
                lambda: step(kind), job["warmup"], job["steps"], group=group, device=device
            )

        def kept(_: int, r: int, step_ms: dict[str, float]) -> None:
            for kind, ms in step_ms.items():
                times[kind].append(ms)

        measure_in_rounds(
            [list(PLANS)], measure, job["rounds"], on_group=kept, order=balanced_order
        )
    return times


def main(argv: list[str]) -> None:
    job = json.loads(argv[0])
    warnings.filterwarnings("ignore")
    with local_process_group(job["rank"], job["world"], job["port"]):
        times = run_path_rounds(job)
        if job["rank"] == 0:
            Path(job["out"]).write_text(json.dumps(times))
    exit_spawned_rank()


if __name__ == "__main__":
    main(sys.argv[1:])
