"""The plan ``dreamshard plan --out`` writes beside its summary, loaded by TorchRec's planner
through :class:`FilePlanLoader` (no planning: TorchRec's loop does not run) and trained
under ``DistributedModelParallel`` on 2 gloo ranks; a task file as the planner's inputs."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from torchrec.distributed.planner.types import PlannerError, PlannerErrorType
from torchrec.distributed.sharding_plan import get_default_sharders

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.planner.adapters.task_inputs import task_inputs
from torchrec_dreamshard.planner.plans.plan_files import FilePlanLoader
from torchrec_dreamshard.policy import DreamShard
from torchrec_dreamshard.policy.checkpoint import save_checkpoint

WORLD = 2
HIST = [0.5, 0.25, 0.125, 0.0625, 0.0625] + [0.0] * 12  # t0's declared reuse


def make_task(num_devices: int = WORLD) -> Task:
    tables = [
        TableSpec(name=f"t{i}", rows=200 * (i + 1), dim=8 * (1 + i % 2), pooling_factor=1.0 + i)
        for i in range(6)
    ]
    tables[0] = TableSpec(name="t0", rows=200, dim=8, pooling_factor=1.0, reuse_hist=tuple(HIST))
    return Task(tables=tables, num_devices=num_devices, memory_bytes=10**7, batch_size=64)


@pytest.fixture()
def planned(tmp_path, run_cli):
    """``dreamshard plan task.json --out plan.json`` (no calibration: nothing measured)."""
    make_task().save(tmp_path / "task.json")
    save_checkpoint(DreamShard.untrained(seed=0), tmp_path / "agent.pt")
    argv = ["plan", str(tmp_path / "task.json"), "--checkpoint", str(tmp_path / "agent.pt")]
    assert run_cli([*argv, "--no-calibrate", "--out", str(tmp_path / "plan.json")]) == 0
    return tmp_path


def job_planner(folder: Path, seed: int = 0, **kwargs):
    """The planner a job of the task builds: the task's inputs and ``dreamshard plan``'s
    settings (``--no-calibrate``), loading the plan file; and the model."""
    from torchrec_dreamshard.planner import DreamShardPlanner

    inputs = task_inputs(Task.load(folder / "task.json"))
    planner = DreamShardPlanner(
        **inputs.planner_arguments(),
        checkpoint=folder / "agent.pt",
        calibrate=False,
        seed=seed,
        plan_loader=FilePlanLoader(folder / "plan.torchrec.json"),
        **kwargs,
    )
    return planner, inputs.model


def test_both_files_are_written_and_the_plan_loads_without_planning(planned):
    summary = json.loads((planned / "plan.json").read_text())
    assert summary["torchrec_plan"] == "plan.torchrec.json"
    planner, model = job_planner(planned)
    plan = planner.plan(model, get_default_sharders())
    assert sum(planner.proposal_log.proposals.values()) == 0  # TorchRec's loop did not run
    placed = {name: ps.ranks for name, ps in plan.plan[""].items()}
    assert sorted(placed) == [f"t{i}" for i in range(6)]
    for name, rank in summary["placement"].items():  # the summary says the same plan
        assert placed[name] == [rank]
    for name, other in summary.get("sharding", {}).items():
        assert placed[name] == other["ranks"]
    assert planner.table_specs.reuse[".t0"] == tuple(HIST)  # the declared reuse


def test_a_planner_of_other_inputs_refuses_the_plan(planned):
    planner, model = job_planner(planned, seed=1)
    with pytest.raises(PlannerError) as err:
        planner.plan(model, get_default_sharders())
    assert err.value.error_type == PlannerErrorType.PLANNER_INPUT_CONTEXT_MISMATCH


def test_declared_reuse_reaches_the_planners_table_specs():
    from torchrec_dreamshard.planner import DreamShardPlanner

    inputs = task_inputs(make_task())
    assert inputs.reuse_hists == {".t0": tuple(HIST)} and inputs.batch_size == 32
    planner = DreamShardPlanner(**inputs.planner_arguments(), agent=DreamShard.untrained(seed=0))
    planner.plan(inputs.model, get_default_sharders())
    specs = planner.table_specs.specs
    assert specs[".t0"].reuse_hist == tuple(HIST) and specs[".t1"].reuse_hist is None
    other = DreamShardPlanner(
        **{**inputs.planner_arguments(), "reuse_hists": None}, agent=DreamShard.untrained(seed=0)
    )
    other.plan(task_inputs(make_task()).model, get_default_sharders())
    assert other.hash_planner_context_inputs_str() != planner.hash_planner_context_inputs_str()


def test_per_device_memory_is_each_ranks_capacity():
    task = Task(
        tables=make_task().tables, num_devices=2, memory_bytes=[10**7, 2 * 10**7], batch_size=64
    )
    assert [d.storage.ddr for d in task_inputs(task).topology.devices] == [10**7, 2 * 10**7]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.update(format="other"), "is not a sharding plan"),
        (lambda d: d.update(context_hash=3), '"context_hash" must be a string'),
        (lambda d: d["options"][0].update(sharding_type=None), "sharding_type must be a str"),
        (lambda d: d["options"][0]["shards"][0].update(rank=-1), "shard 0: rank must be"),
        (lambda d: d["options"][0]["shards"][0].update(perf={"speed": 1.0}), "perf must be"),
        (lambda d: d["options"][0].update(shape=[1.5, 8]), "shape must be a list of whole"),
    ],
)
def test_a_bad_plan_file_is_refused_naming_the_field(planned, change, message):
    path = planned / "plan.torchrec.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message) as err:
        FilePlanLoader(path)
    assert "plan.torchrec.json" in str(err.value)


# -- a DMP job trains with the plan ----------------------------------------------------------


def train_with_loaded_plan(rank: int, folder: str) -> dict:
    """Load the plan on this rank, shard the task's model with it under DMP and train one
    step (SGD fused in the backward): the plan, the loss and whether the step changed the
    pooled embeddings."""
    from conftest import CPU_DENSE_LIKE, GLOO_LIKE
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from torchrec_dreamshard.evaluation.step_model import sample_kjt

    planner, model = job_planner(Path(folder), collectives=GLOO_LIKE, dense_kernel=CPU_DENSE_LIKE)
    _apply_optimizer_in_backward(torch.optim.SGD, model.parameters(), {"lr": 0.5})
    sharders = get_default_sharders()
    plan = planner.plan(model, sharders)
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    task = Task.load(Path(folder) / "task.json")
    batch = sample_kjt(task.tables, task.batch_size // WORLD, seed=rank)
    before = dmp(batch).values().detach().clone()
    loss = dmp(batch).values().sum()
    loss.backward()
    after = dmp(batch).values().detach()
    return {
        "plan": str(plan),
        "proposals": sum(planner.proposal_log.proposals.values()),
        "loss": float(loss.detach()),
        "changed": float((after - before).abs().max()),
    }


def dmp_worker(rank: int, world: int, port: int, folder: str) -> None:
    from torchrec_dreamshard.ranks.spawn import exit_spawned_rank, local_process_group

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    with local_process_group(rank, world, port):
        result = train_with_loaded_plan(rank, folder)
    (Path(folder) / f"rank{rank}.json").write_text(json.dumps(result))
    exit_spawned_rank()


@pytest.mark.slow
@pytest.mark.usefixtures("comm_model")  # every rank's reference-kernel time from tmp_path
def test_a_dmp_job_on_two_gloo_ranks_trains_with_the_loaded_plan(planned):
    import torch.multiprocessing as mp

    from torchrec_dreamshard.ranks.spawn import free_port

    mp.spawn(dmp_worker, args=(WORLD, free_port(), str(planned)), nprocs=WORLD, join=True)
    results = [json.loads((planned / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert results[0]["plan"] == results[1]["plan"]
    for res in results:
        assert res["proposals"] == 0  # loaded on every rank, not planned
        assert torch.isfinite(torch.tensor(res["loss"]))
        assert res["changed"] > 0  # the step trained the embeddings


def test_a_table_that_fits_no_device_whole_may_be_split_below_torchrecs_128_columns():
    big = TableSpec(name="big", rows=20_000, dim=64, pooling_factor=4.0)
    tables = [big, *make_task().tables[1:]]
    memory = int(0.9 * big.size_bytes)  # fits no device: it is split, as a task file means
    task = Task(tables=tables, num_devices=2, memory_bytes=memory, batch_size=64,
                allow_oversized=True)  # fmt: skip
    constraints = task_inputs(task).constraints
    assert constraints["big"].min_partition == 4
    assert all(constraints[f"t{i}"].min_partition is None for i in range(1, 6))
