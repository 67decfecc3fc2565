"""``dreamshard plan`` through its entry point."""

from __future__ import annotations

import json

import pytest

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.policy import DreamShard
from torchrec_dreamshard.policy.checkpoint import save_checkpoint


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


def test_plan_writes_json_and_png(files, capsys, run_cli):
    out, png = files / "plan.json", files / "plan.png"
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "agent.pt")]
    assert run_cli([*argv, "--out", str(out), "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    assert "placed 6 tables on 3 devices" in printed
    assert "predicted step cost" in printed
    plan = json.loads(out.read_text())
    assert set(plan) == {
        "placement",
        "predicted_cost_ms",
        "per_device",
        "candidates",
        "adaptation",
    }
    assert plan["adaptation"]["mode"] == "auto" and not plan["adaptation"]["calibrated"]
    names = [c["name"] for c in plan["candidates"]["candidates"]]
    assert plan["candidates"]["winner"] == names[0]  # the winner is listed first
    assert plan["candidates"]["candidates"][0]["vs_winner"] == 1.0
    assert sorted(plan["placement"]) == [f"t{i}" for i in range(6)]
    assert all(0 <= d < 3 for d in plan["placement"].values())
    assert plan["predicted_cost_ms"] > 0
    assert len(plan["per_device"]) == 3
    for dev in plan["per_device"]:
        assert dev["bytes"] <= dev["memory_bytes"]
        assert {"fwd_ms", "bwd_ms", "comm_ms", "total_ms", "tables"} <= set(dev)
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "flags, splits, verify_k",
    [([], True, 0), (["--no-splits"], False, 0), (["--verify", "2"], True, 2)],
)
def test_plan_calibrates_places_and_verifies_through_plan_task(
    files, monkeypatch, run_cli, flags, splits, verify_k
):
    """``dreamshard plan`` plans through ``calibration.plan_task``, the planner's path, with
    splits unless ``--no-splits`` and the verification ``--verify`` asks for."""
    from torchrec_dreamshard import calibration

    calls, real = [], calibration.plan_task

    def spy(agent, task, **kwargs):
        calls.append(kwargs)
        return real(agent, task, **{**kwargs, "verification": None})  # nothing measured here

    monkeypatch.setattr(calibration, "plan_task", spy)
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "agent.pt")]
    assert run_cli([*argv, "--no-calibrate", *flags]) == 0
    assert [(c["splits"], c["verification"].k, c["calibration"]) for c in calls] == [
        (splits, verify_k, None)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("flag", [None, "--no-calibrate", "--calibrate"])
def test_plan_calibrates_by_default_where_the_checkpoint_misprices_this_machine(
    files, monkeypatch, capsys, run_cli, flag
):
    """Here this machine runs the reference kernel 10x slower than the checkpoint predicts:
    by default `dreamshard plan` calibrates (and says why); --no-calibrate never does."""
    from torchrec_dreamshard.calibration import auto

    agent = DreamShard.untrained(seed=0)
    fwd, bwd = auto.check_machine(agent, None).predicted_ms
    monkeypatch.setattr(auto, "measured_reference_ms", lambda device="cpu": (10 * fwd, 10 * bwd))
    out = files / "plan.json"
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "agent.pt")]
    argv += ["--out", str(out), "--budget-s", "5", "--store", str(files / "cal.sqlite")]
    assert run_cli([*argv, *([flag] if flag else [])]) == 0
    adaptation = json.loads(out.read_text())["adaptation"]
    assert adaptation["mode"] == {None: "auto", "--no-calibrate": "off"}.get(flag, "on")
    assert adaptation["calibrated"] is (flag != "--no-calibrate")
    if flag is None:
        assert adaptation["reference_error"] == pytest.approx(-0.9)
        assert "calibrating on this machine" in capsys.readouterr().out
    if adaptation["calibrated"] and adaptation["kernels_discarded"]:
        # the machine changed speed while calibrating (the reference kernel drifted):
        # what was measured is not learned, and the output says so
        assert "drifted" in adaptation["calibration_note"]
        assert adaptation["calibration_note"] in adaptation["summary"][0]
    elif adaptation["calibrated"]:
        assert adaptation["kernel_mape_after"] < adaptation["kernel_mape_before"]


def test_plan_weighs_torchrecs_candidate(files, monkeypatch, run_cli):
    """`dreamshard plan` hands the planner side's candidate sources to the agent."""
    from torchrec_dreamshard.planner.candidates import TorchRecCandidate
    from torchrec_dreamshard.policy import NoPlanError

    def probe(self, task):
        raise NoPlanError("asked")

    monkeypatch.setattr(TorchRecCandidate, "propose", probe)
    out = files / "plan.json"
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "agent.pt")]
    assert run_cli([*argv, "--no-splits", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["candidates"]["no_plan"]["torchrec_ours"] == "asked"


def test_plan_search_mode(files, monkeypatch, run_cli):
    from torchrec_dreamshard.policy.checkpoint import load_checkpoint

    calls = []
    place = DreamShard.place

    def spy(self, task, mode="greedy", num_samples=16, seed=0):
        calls.append((mode, num_samples, seed))
        return place(self, task, mode, num_samples, seed)

    monkeypatch.setattr(DreamShard, "place", spy)
    out = files / "plan.json"
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "agent.pt")]
    assert (
        run_cli([*argv, "--mode", "search", "--num-samples", "4", "--seed", "5", "--out", str(out)])
        == 0
    )
    # the split search may run the policy again on tasks of shards, always as asked
    assert calls and set(calls) == {("search", 4, 5)}
    task = Task.load(files / "task.json")
    expected = place(load_checkpoint(files / "agent.pt"), task, "search", 4, 5)
    assert json.loads(out.read_text())["placement"] == {
        t.name: d for t, d in zip(task.tables, expected, strict=True)
    }


def test_plan_errors_name_the_input(files, capsys, run_cli):
    assert run_cli(["plan", str(files / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "nope.pt")]
    assert run_cli(argv) == 2
    assert "nope.pt" in capsys.readouterr().err


BASE = {
    "num_devices": 2,
    "memory_bytes": 10**9,
    "batch_size": 512,
    "tables": [{"name": "t0", "rows": 1000, "dim": 16, "pooling_factor": 2.0}],
}


def _variant(**changes):
    doc = json.loads(json.dumps(BASE))
    for key, value in changes.items():
        if key.startswith("t_"):
            doc["tables"][0][key[2:]] = value
        else:
            doc[key] = value
    return json.dumps(doc)


@pytest.mark.parametrize(
    "text, message",
    [
        (_variant(t_reuse_hist=5), "reuse_hist must be a list"),
        (_variant(num_devices=10**12), "num_devices must be at most 4096"),
        (_variant(t_rows=10**400), "rows must be in 1.."),
        (_variant(t_pooling_factor=1e308), "pooling_factor must be"),
        (_variant(batch_size=10**18), "batch_size must be at most"),
        (_variant(memory_bytes=0.5), "memory_bytes of device 0 must be a whole number"),
        (_variant(t_bytes_per_element=2.0), "bytes_per_element must be the integer"),
        (_variant(t_reuse_hist=[True] + [False] * 16), "reuse_hist must hold numbers"),
        (_variant(t_rows=1).replace('"rows": 1,', '"rows": ' + "9" * 5000 + ","), "digits"),
        (_variant().replace('"num_devices": 2', '"num_devices": 2, "num_devices": 3'), "duplicate"),
        ("[" * 200_000 + "]" * 200_000, "nested"),
        (b'{"a": "\xff"}', "not UTF-8"),
    ],
)
def test_every_bad_task_is_one_line_naming_the_file(files, capsys, text, message, run_cli):
    path = files / "bad.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    assert run_cli(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "bad.json" in err and message in err, err


def test_task_path_that_is_a_directory(files, capsys, run_cli):
    assert run_cli(["plan", str(files)]) == 2
    assert "is a directory" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--out", "--plot"])
@pytest.mark.parametrize("where", ["missing/plan.x", "DIR"])
def test_bad_output_paths_fail_before_planning(files, capsys, flag, where, run_cli):
    target = str(files) if where == "DIR" else str(files / where)
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "agent.pt")]
    assert run_cli([*argv, flag, target]) == 2
    captured = capsys.readouterr()
    assert "placed" not in captured.out  # refused before any planning
    assert flag in captured.err and captured.err.count("\n") == 1


def test_unwritable_output_is_one_line(files, capsys, monkeypatch, run_cli):
    import os

    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if "ro" in str(p) else real(p, mode))
    (files / "ro.json").write_text("{}")
    argv = ["plan", str(files / "task.json"), "--out", str(files / "ro.json")]
    assert run_cli(argv) == 2
    assert "not writable" in capsys.readouterr().err


def test_os_errors_are_one_line_and_debug_shows_the_traceback(files, capsys, monkeypatch, run_cli):
    from torchrec_dreamshard.cli import plan as plan_cli

    def boom(*a, **k):
        raise PermissionError(13, "Permission denied", "somewhere.json")

    monkeypatch.setattr(plan_cli, "plan_dict", boom)
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "agent.pt")]
    assert run_cli(argv) == 2
    assert "Permission denied: 'somewhere.json'" in capsys.readouterr().err
    with pytest.raises(PermissionError):
        run_cli([*argv, "--debug"])


def test_non_finite_prediction_names_the_tables(files):
    from torchrec_dreamshard.cli.plan import plan_dict

    task = Task.load(files / "task.json")

    class Bad:
        step_ms = float("nan")
        fwd_ms = [float("nan"), 1.0, 1.0]
        bwd_ms = comm_ms = [1.0, 1.0, 1.0]

    placement = [0, 1, 2, 0, 1, 2]
    with pytest.raises(ValueError, match=r"not finite.*\['t0', 't3'\]"):
        plan_dict(task, placement, Bad())


def test_plan_splits_a_table_too_big_for_every_device(tmp_path, capsys, run_cli):
    tables = [TableSpec(name="big", rows=20_000, dim=64, pooling_factor=4.0)] + [
        TableSpec(name=f"t{i}", rows=1000, dim=16, pooling_factor=2.0) for i in range(6)
    ]
    total = sum(t.size_bytes for t in tables)
    task = {
        **Task(tables=tables, num_devices=4, memory_bytes=total, batch_size=256).to_dict(),
        "memory_bytes": int(1.3 * total / 4),
    }
    (tmp_path / "task.json").write_text(json.dumps(task))
    save_checkpoint(DreamShard.untrained(seed=0), tmp_path / "agent.pt")
    argv = ["plan", str(tmp_path / "task.json"), "--checkpoint", str(tmp_path / "agent.pt")]
    out = tmp_path / "plan.json"
    assert run_cli([*argv, "--out", str(out)]) == 0
    assert "split column-wise: big x" in capsys.readouterr().out
    plan = json.loads(out.read_text())
    assert "big" not in plan["placement"] and sorted(plan["placement"]) == [
        f"t{i}" for i in range(6)
    ]
    cols = [s["columns"] for s in plan["shards"]["big"]]
    assert cols[0][0] == 0 and cols[-1][1] == 64
    assert all(a[1] == b[0] for a, b in zip(cols, cols[1:], strict=False))
    assert all(d["bytes"] <= d["memory_bytes"] for d in plan["per_device"])
    assert run_cli([*argv, "--no-splits"]) == 2
    assert "bigger than every device" in capsys.readouterr().err


def test_cli_plan_verifies_by_default_only_where_it_calibrates_automatically():
    from torchrec_dreamshard.calibration import (
        CalibrationConfig,
        VerificationSettings,
        VerifyOptions,
    )
    from torchrec_dreamshard.calibration.auto import AUTO_VERIFY_K, AUTO_VERIFY_S
    from torchrec_dreamshard.cli.plan import verify_settings

    config = CalibrationConfig()
    none, three = VerificationSettings(0), VerificationSettings(3)
    auto = VerifyOptions(budget_s=AUTO_VERIFY_S, cache=True, incumbent="chosen")
    default = VerificationSettings(AUTO_VERIFY_K, None, auto)
    assert verify_settings(None, {"mode": "auto"}, config) == default
    assert verify_settings(None, {"mode": "auto"}, None) == none  # priced right
    assert verify_settings(None, {"mode": "on"}, config) == none  # --calibrate
    assert verify_settings(3, {"mode": "off"}, None) == three  # --verify 3
    assert (
        verify_settings(3, {"mode": "off"}, None, rounds=5).options.rounds == 5
    )  # --verify-rounds


def test_plan_says_what_its_measuring_took_and_bought(files, capsys, run_cli):
    """`dreamshard plan --verify` prints one line of what the verification took and bought
    (plans measured, seconds, the plan kept and its measured margins over TorchRec's plan
    and the best heuristic's); without verification, the predicted margins."""
    import re

    out = files / "plan.json"
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "agent.pt")]
    argv += ["--no-calibrate", "--no-splits", "--out", str(out)]
    assert run_cli([*argv, "--verify", "1", "--verify-rounds", "2"]) == 0
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("verified "))
    assert re.match(r"verified \d+ plans in \d+\.\d s \(2 rounds\): kept ", line), line
    plan = json.loads(out.read_text())
    margins = plan["adaptation"]["margins"]
    assert margins["measured"] and plan["adaptation"]["summary"] == [line]
    assert any(p["torchrec"] and len(p["rounds_ms"]) == 2 for p in plan["verification"]["plans"])
    if plan["verification"]["plans"][0]["torchrec"]:  # the kept plan is TorchRec's own
        assert "kept TorchRec's plan" in line or "the same as TorchRec's" in line
    else:
        assert margins["vs_torchrec"] < 1.0 and "faster than TorchRec's" in line
    assert run_cli(argv) == 0
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("kept "))
    assert "TorchRec's" in line and "(not measured)" in line
