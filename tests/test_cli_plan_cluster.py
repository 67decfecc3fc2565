"""``dreamshard plan`` of a GPU cluster on this CPU-only machine: a task of 1,000 tables
for 16 hosts of 8 GPUs, priced by the bundled CPU checkpoint (``--no-measure``: the first
line says so) or by a profile measured on one device (nothing timed), and the plan
TorchRec's ``PlanLoader`` loads written beside the summary."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torchrec.distributed.planner.types import PlanLoader
from torchrec.distributed.sharding_plan import get_default_sharders

from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure.gate import no_measuring
from torchrec_dreamshard.planner.adapters.task_inputs import task_inputs
from torchrec_dreamshard.planner.plans.plan_files import FilePlanLoader

HOSTS, LOCAL, TABLES = 16, 8, 1000
HBM = 80 * 10**9  # bytes per GPU


@pytest.fixture(scope="module")
def cluster_task(tmp_path_factory):
    """A task file of 1,000 tables for 16 hosts of 8 CUDA devices."""
    rng = np.random.default_rng(0)
    tables = [
        {
            "name": f"t{i}",
            "rows": int(rng.integers(10_000, 2_000_000)),
            "dim": int(rng.choice([32, 64, 128])),
            "pooling_factor": float(rng.uniform(1, 30)),
        }
        for i in range(TABLES)
    ]
    doc = {
        "compute_device": "cuda",
        "hosts": HOSTS,
        "local_world_size": LOCAL,
        "memory_bytes": HBM,
        "global_batch_size": HOSTS * LOCAL * 512,
        "tables": tables,
    }
    path = tmp_path_factory.mktemp("cluster") / "task.json"
    path.write_text(json.dumps(doc))
    return path


def check_plan_file(path, task: Task) -> None:
    """The plan file loads through TorchRec's ``PlanLoader`` protocol: every table, on the
    cluster's ranks."""
    loader = FilePlanLoader(path)
    assert isinstance(loader, PlanLoader)
    options = loader.load()
    assert {o.name for o in options.values()} == set(task.names)
    ranks = {s.rank for o in options.values() for s in o.shards}
    assert ranks <= set(range(HOSTS * LOCAL)) and len(ranks) > LOCAL  # beyond one host
    assert all(o.batch_size == 512 for o in options.values())  # TorchRec's per-rank batch


@pytest.mark.skipif(torch.cuda.is_available(), reason="plans GPUs on a machine without one")
def test_a_gpu_cluster_planned_unmeasured_says_so_first_and_writes_the_plan_torchrec_loads(
    cluster_task, tmp_path, capsys, run_cli
):
    out = tmp_path / "plan.json"
    with no_measuring("--no-measure times nothing"):
        assert run_cli(["plan", str(cluster_task), "--no-measure", "--out", str(out)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("prices: the bundled CPU checkpoint's cost network, not measured")
    assert "128 devices (cuda, 16 hosts of 8)" in first and "--no-measure" in first
    task = Task.load(cluster_task)
    check_plan_file(tmp_path / "plan.torchrec.json", task)
    # a job of the same inputs and settings loads it in place of planning
    from torchrec_dreamshard.planner import DreamShardPlanner

    inputs = task_inputs(task)
    assert inputs.topology.compute_device == "cuda" and inputs.topology.local_world_size == 8
    assert inputs.topology.devices[0].storage.hbm == HBM
    planner = DreamShardPlanner(
        **inputs.planner_arguments(),
        measure=False,
        plan_loader=FilePlanLoader(tmp_path / "plan.torchrec.json"),
    )
    with no_measuring("a loaded plan times nothing"):
        plan = planner.plan(inputs.model, get_default_sharders())
    assert sum(planner.proposal_log.proposals.values()) == 0  # TorchRec's loop did not run
    summary = json.loads(out.read_text())
    loaded = {name: ps.ranks for name, ps in plan.plan[""].items()}
    for name, rank in summary["placement"].items():
        assert loaded[name] == [rank]


def one_device_profile(path) -> None:
    """A profile as ``benchmarks/gpu_check.py run --device cpu`` writes it
    (``save_profile``): one device's reference kernel and the cost network calibrated
    there, stamped with that device."""
    from torchrec_dreamshard.policy.checkpoint import load_checkpoint
    from torchrec_dreamshard.profile.machine_profile import MachineProfile, ProfileCalibration
    from torchrec_dreamshard.profile.stamp import MachineStamp

    prior = load_checkpoint()
    calibration = ProfileCalibration(
        prior=prior.fingerprint(),
        cost_net={k: v.detach().clone() for k, v in prior.cost_net.state_dict().items()},
        meta=dict(prior.meta),
        summary={"kernels": 0},
    )
    MachineProfile(
        stamp=MachineStamp.here("cpu", 1, 1),
        reference_ms=(0.5, 1.0),
        calibration=calibration,
        notes=("measured by benchmarks/gpu_check.py on one device: no collectives",),
    ).save(path)


def test_a_gpu_cluster_planned_from_a_profile_times_nothing(
    cluster_task, tmp_path, capsys, run_cli
):
    profile = tmp_path / "profile.pt"
    one_device_profile(profile)
    out = tmp_path / "plan.json"
    argv = ["plan", str(cluster_task), "--profile", str(profile), "--out", str(out)]
    with no_measuring("a plan from a profile times nothing"):
        assert run_cli(argv) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"prices: the profile {profile} (measured on cpu")
    assert "nothing is timed here" in first
    assert json.loads(out.read_text())["adaptation"]["profile_given"]
    check_plan_file(tmp_path / "plan.torchrec.json", Task.load(cluster_task))


def test_the_cluster_flags_override_the_task_file(tmp_path, capsys, run_cli):
    task = {
        "num_devices": 2,
        "memory_bytes": 10**9,
        "global_batch_size": 512,
        "tables": [
            {"name": f"t{i}", "rows": 1000, "dim": 16, "pooling_factor": 2.0} for i in range(4)
        ],
    }
    path = tmp_path / "task.json"
    path.write_text(json.dumps(task))
    argv = ["plan", str(path), "--no-measure", "--compute-device", "cuda"]
    with no_measuring("--no-measure times nothing"):
        assert run_cli([*argv, "--hosts", "2", "--local-world-size", "2"]) == 0
    printed = capsys.readouterr().out
    assert "placed 4 tables on 4 devices (cuda, 2 hosts of 2)" in printed
    assert run_cli([*argv, "--hosts", "2"]) == 2
    assert "--hosts needs --local-world-size" in capsys.readouterr().err
