"""``dreamshard demo`` through its entry point, on a small model."""

from __future__ import annotations

import json

import pytest

from torchrec_dreamshard.cli import main
from torchrec_dreamshard.policy import DreamShard
from torchrec_dreamshard.policy.checkpoint import save_checkpoint


@pytest.mark.slow
def test_demo_prints_the_side_by_side_and_trains(tmp_path, capsys, monkeypatch):
    """The default planner, on an untrained checkpoint that misprices any machine: it
    measures the reference kernel here, calibrates, and says so."""
    from torchrec_dreamshard.cache import reference_time
    from torchrec_dreamshard.planner.steps import machine_sources

    monkeypatch.setenv("DREAMSHARD_CALIBRATION_STORE", str(tmp_path / "calibration.sqlite"))
    # this test measures the machine as a user's first run does (conftest pins it)
    monkeypatch.setattr(machine_sources, "load_reference_ms", reference_time.load_reference_ms)
    ckpt, out = tmp_path / "agent.pt", tmp_path / "demo.json"
    save_checkpoint(DreamShard.untrained(seed=0), ckpt)
    argv = ["demo", "--tables", "8", "--devices", "2", "--global-batch-size", "512"]
    argv += ["--train-steps", "2", "--checkpoint", str(ckpt), "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "measured on real FBGEMM kernels" in printed
    assert "TorchRec default planner" in printed
    assert "predicted per-rank embedding times" in printed
    assert "== adapting to this machine ==" in printed
    result = json.loads(out.read_text())
    for name in ("dreamshard", "torchrec"):
        planner = result["planners"][name]
        assert len(planner["placement"]) == 8
        assert planner["measured"]["step_ms"] > 0
        assert planner["predicted_step_ms"] > 0 and planner["checkpoint_step_ms"] > 0
    adaptation = result["planners"]["dreamshard"]["adaptation"]
    assert adaptation["mode"] == "auto" and adaptation["reference_measured_ms"] > 0
    # an untrained network is far off, so it calibrates; on a busy machine the drift check
    # may discard every kernel it measured, and then the notes say so
    notes = " ".join(adaptation["measuring_notes"])
    assert adaptation["calibrated"] or "calibration kept no kernel" in notes, adaptation
    assert "calibrated in" in printed or "calibration kept no kernel" in printed
    training = result["training"]
    assert training["ranks"] == 2 and sum(training["tables_per_rank"]) == 8
    assert len(training["losses"]) == 2
    assert training["adaptation"]["mode"] == "auto"
