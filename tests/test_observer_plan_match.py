"""``observe(planner, dmp)`` refuses a DMP built from another plan than the planner's last
one (its report would price the job with the wrong prediction), and takes the DMP built
from it: on 2 gloo ranks, every rank."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from torchrec_dreamshard.ranks.spawn import exit_spawned_rank, free_port, local_process_group

WORLD = 2


def rank_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    with local_process_group(rank, world, port):
        result = observe_both(world)
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
    exit_spawned_rank()


def observe_both(world: int) -> dict:
    """Plan with DreamShard (every table table-wise) and with TorchRec (every table data
    parallel); observe the DreamShard planner with a DMP of each plan."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrun_job import LOCAL_BATCH, build_model

    from torchrec_dreamshard import observe
    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.planner.adapters.topology import torchrec_topology

    sharders = [EmbeddingBagCollectionSharder()]
    model = build_model()
    ebc = model.model.sparse_arch.embedding_bag_collection
    names = [c.name for c in ebc.embedding_bag_configs()]

    def only(kind: str) -> dict:
        return {n: ParameterConstraints(sharding_types=[kind]) for n in names}

    topology = torchrec_topology(world, "cpu")
    ours = DreamShardPlanner(
        topology=topology, batch_size=LOCAL_BATCH, constraints=only("table_wise"), measure=False
    )
    plan = ours.collective_plan(model, sharders, dist.GroupMember.WORLD)
    theirs = EmbeddingShardingPlanner(
        topology=topology, batch_size=LOCAL_BATCH, constraints=only("data_parallel")
    ).collective_plan(model, sharders, dist.GroupMember.WORLD)
    cpu = torch.device("cpu")
    result: dict = {}
    matched = DistributedModelParallel(
        build_model(), device=cpu, plan=copy.deepcopy(plan), sharders=sharders
    )
    observer = observe(ours, matched)  # the planner's own plan: no error
    result["matched_plan"] = observer.plan is ours.plan_record.plan
    other = DistributedModelParallel(build_model(), device=cpu, plan=theirs, sharders=sharders)
    try:
        observe(ours, other)
        result["mismatch"] = None
    except ValueError as exc:
        result["mismatch"] = str(exc)
    return result


@pytest.mark.slow
def test_observe_refuses_a_dmp_of_another_plan_on_every_rank(tmp_path):
    mp.spawn(rank_worker, args=(WORLD, free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for result in results:
        assert result["matched_plan"]
        message = result["mismatch"]
        assert message is not None, "a DMP of another plan was observed silently"
        assert "the DMP was built from another plan than the one observed" in message
        assert "observe the planner that made the DMP's plan" in message
        assert "observer.follow(dmp, new_plan)" in message
