"""``dreamshard profile``: measure a machine profile once, show it, plan from it."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed.sharding_plan import get_default_sharders

from torchrec_dreamshard import DreamShardPlanner
from torchrec_dreamshard.cli import main
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure.gate import no_measuring
from torchrec_dreamshard.planner.adapters.topology import torchrec_topology
from torchrec_dreamshard.profile.machine_profile import MachineProfile


def test_profile_writes_a_file_that_show_reads_and_a_planner_plans_from(
    comm_model, tmp_path, capsys
):
    out = tmp_path / "machine.profile"
    assert main(["profile", "--out", str(out), "--devices", "4"]) == 0
    profile = MachineProfile.load(out)
    assert profile.stamp.world_size == 4 and profile.stamp.device == "cpu"
    # the test session pins the machine's models (conftest: fixed_collectives)
    assert profile.collectives is not None and profile.dense_kernel is not None
    assert not profile.calibrated  # no task: nothing to calibrate on
    capsys.readouterr()
    assert main(["profile", "--show", str(out)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["stamp"]["world_size"] == 4
    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=16, num_embeddings=1000, feature_names=[f"f{i}"]
        )
        for i in range(6)
    ]
    model = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    with no_measuring("a planner given a profile times nothing"):
        planner = DreamShardPlanner(
            topology=torchrec_topology(4, "cpu"), batch_size=32, profile=str(out)
        )
        assert planner.plan(model, get_default_sharders()).plan
    assert planner.adaptation["profile_given"]


def test_profile_needs_an_out_file_or_show(capsys):
    assert main(["profile"]) == 2
    assert "--out" in capsys.readouterr().err


def test_profile_refuses_hosts_that_do_not_divide_the_devices(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["profile", "--out", str(out), "--devices", "6", "--local-devices", "4"]) == 2
    assert "--local-devices" in capsys.readouterr().err


@pytest.mark.slow
def test_profile_with_a_task_calibrates_on_its_tables(comm_model, tmp_path):
    task = Task(
        tables=[
            TableSpec(name=f"t{i}", rows=2000 * (i + 1), dim=16, pooling_factor=4.0)
            for i in range(4)
        ],
        num_devices=2,
        memory_bytes=2**30,
        batch_size=256,
    )
    task.save(tmp_path / "task.json")
    out = tmp_path / "machine.profile"
    args = ["profile", "--out", str(out), "--task", str(tmp_path / "task.json")]
    # the drift check off: on a loaded machine it may discard every kernel
    assert main([*args, "--budget-s", "8", "--drift-limit", "inf"]) == 0
    profile = MachineProfile.load(out)
    assert profile.calibrated
    summary = profile.calibration.summary
    assert summary["kernels_measured"] + summary["kernels_reused"] >= 4
    assert math.isfinite(summary["kernel_mape_after"])
