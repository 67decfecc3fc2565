"""``dreamshard demo`` through its entry point, on a small model."""

from __future__ import annotations

import json

import pytest

from torchrec_dreamshard.cli import main
from torchrec_dreamshard.policy import DreamShard
from torchrec_dreamshard.policy.checkpoint import save_checkpoint


@pytest.mark.slow
def test_demo_prints_the_side_by_side_and_trains(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DREAMSHARD_CALIBRATION_STORE", str(tmp_path / "calibration.sqlite"))
    ckpt, out = tmp_path / "agent.pt", tmp_path / "demo.json"
    save_checkpoint(DreamShard.untrained(seed=0), ckpt)
    argv = ["demo", "--tables", "8", "--devices", "2", "--batch-size", "512"]
    argv += ["--train-steps", "2", "--checkpoint", str(ckpt), "--out", str(out)]
    argv += ["--calibrate-budget", "5"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "measured on real FBGEMM kernels" in printed
    assert "TorchRec default planner" in printed
    assert "predicted per-rank embedding times" in printed
    result = json.loads(out.read_text())
    for name in ("dreamshard", "torchrec"):
        planner = result["planners"][name]
        assert len(planner["placement"]) == 8
        assert planner["measured"]["step_ms"] > 0
    assert "predicted before" in printed and "calibration:" in printed
    calibrated = result["calibration"]["plans"]
    assert set(calibrated) == {"DreamShardPlanner", "TorchRec default", "calibrated DreamShard"}
    assert all(r["measured_ms"] > 0 and r["after_ms"] > 0 for r in calibrated.values())
    training = result["training"]
    assert training["ranks"] == 2 and sum(training["tables_per_rank"]) == 8
    assert len(training["losses"]) == 2
