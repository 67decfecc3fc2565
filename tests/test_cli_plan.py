"""``dreamshard plan`` through its entry point."""

from __future__ import annotations

import json
import warnings

import pytest

from torchrec_dreamshard.checkpoint import save_checkpoint
from torchrec_dreamshard.cli import main
from torchrec_dreamshard.policy import DreamShard
from torchrec_dreamshard.tables import TableSpec
from torchrec_dreamshard.tasks import Task


@pytest.fixture()
def files(tmp_path):
    tables = [
        TableSpec(name=f"t{i}", rows=1000 * (i + 1), dim=16, pooling_factor=2.0 + i)
        for i in range(6)
    ]
    task = Task(tables=tables, num_devices=3, memory_bytes=2_000_000, batch_size=256)
    task.save(tmp_path / "task.json")
    save_checkpoint(DreamShard.untrained(seed=0), tmp_path / "agent.pt")
    return tmp_path


def run(argv):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return main(argv)


def test_plan_writes_json_and_png(files, capsys):
    out, png = files / "plan.json", files / "plan.png"
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "agent.pt")]
    assert run([*argv, "--out", str(out), "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    assert "placed 6 tables on 3 devices" in printed
    assert "predicted step cost" in printed
    plan = json.loads(out.read_text())
    assert set(plan) == {"placement", "predicted_cost_ms", "per_device"}
    assert sorted(plan["placement"]) == [f"t{i}" for i in range(6)]
    assert all(0 <= d < 3 for d in plan["placement"].values())
    assert plan["predicted_cost_ms"] > 0
    assert len(plan["per_device"]) == 3
    for dev in plan["per_device"]:
        assert dev["bytes"] <= dev["memory_bytes"]
        assert {"fwd_ms", "bwd_ms", "comm_ms", "total_ms", "tables"} <= set(dev)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plan_search_mode(files, monkeypatch):
    from torchrec_dreamshard.checkpoint import load_checkpoint

    calls = []
    place = DreamShard.place

    def spy(self, task, mode="greedy", num_samples=16, seed=0):
        calls.append((mode, num_samples, seed))
        return place(self, task, mode, num_samples, seed)

    monkeypatch.setattr(DreamShard, "place", spy)
    out = files / "plan.json"
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "agent.pt")]
    assert (
        run([*argv, "--mode", "search", "--num-samples", "4", "--seed", "5", "--out", str(out)])
        == 0
    )
    assert calls == [("search", 4, 5)]
    task = Task.load(files / "task.json")
    expected = place(load_checkpoint(files / "agent.pt"), task, "search", 4, 5)
    assert json.loads(out.read_text())["placement"] == {
        t.name: d for t, d in zip(task.tables, expected, strict=True)
    }


def test_plan_errors_name_the_input(files, capsys):
    assert run(["plan", str(files / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "nope.pt")]
    assert run(argv) == 2
    assert "nope.pt" in capsys.readouterr().err
