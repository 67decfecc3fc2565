"""``dreamshard plan`` through its entry point: it plans with ``DreamShardPlanner`` and
writes a summary and, beside it, the plan TorchRec's ``PlanLoader`` loads
(tests/test_plan_files.py loads it into planners and a DMP job)."""

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
    # the global batch divides among the devices (TorchRec plans a per-rank batch)
    task = Task(tables=tables, num_devices=3, memory_bytes=2_000_000, batch_size=255)
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
        "torchrec_plan",
    }
    assert plan["torchrec_plan"] == "plan.torchrec.json"
    assert json.loads((files / "plan.torchrec.json").read_text())["options"]
    assert plan["adaptation"]["mode"] == "auto" and not plan["adaptation"]["calibrated"]
    names = [c["name"] for c in plan["candidates"]["candidates"]]
    assert plan["candidates"]["winner"] == names[0]  # the winner is listed first
    assert plan["candidates"]["candidates"][0]["vs_winner"] == 1.0
    assert sorted(plan["placement"]) == [f"t{i}" for i in range(6)]
    assert all(0 <= d < 3 for d in plan["placement"].values())
    assert plan["predicted_cost_ms"] > 0
    assert len(plan["per_device"]) == 3
    for dev in plan["per_device"]:  # bytes: TorchRec's storage estimate of its shards
        assert 0 < dev["bytes"] <= dev["memory_bytes"]
        assert {"fwd_ms", "bwd_ms", "comm_ms", "other_ms", "total_ms", "tables"} <= set(dev)
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "flags, expected",
    [
        ([], {"calibrate": None, "verify": None, "timeout_seconds": None, "mode": "safe"}),
        (["--no-calibrate", "--verify", "2"], {"calibrate": False, "verify": 2}),
        (["--mode", "greedy", "--num-samples", "3", "--seed", "7"], {"mode": "greedy"}),
        (["--timeout", "30"], {"timeout_seconds": 30.0}),
        (["--no-splits"], {}),
        (["--no-measure"], {"measure": False, "profile": None}),
        (
            ["--cache-dir", "/tmp/dreamshard-test-cache"],
            {"cache_dir": "/tmp/dreamshard-test-cache"},
        ),
    ],
)
def test_plan_plans_through_dreamshard_planner(files, monkeypatch, run_cli, flags, expected):
    """``dreamshard plan`` plans with ``DreamShardPlanner``: the task's model, topology,
    per-rank batch and pooling factors, and the flags with the planner's meaning."""
    from torchrec_dreamshard.planner import DreamShardPlanner

    made, real = [], DreamShardPlanner.__init__

    def spy(self, *args, **kwargs):
        made.append(kwargs)
        real(self, *args, **kwargs)

    monkeypatch.setattr(DreamShardPlanner, "__init__", spy)
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "agent.pt")]
    assert run_cli([*argv, *flags]) == 0
    [kw] = made
    assert {k: kw[k] for k in expected} == expected
    assert kw["batch_size"] == 255 // 3 and kw["topology"].world_size == 3
    assert [d.storage.ddr for d in kw["topology"].devices] == [2_000_000] * 3
    assert kw["checkpoint"] == str(files / "agent.pt")
    assert {n: c.pooling_factors for n, c in kw["constraints"].items()} == {
        f"t{i}": [2.0 + i] for i in range(6)
    }
    types = {tuple(c.sharding_types or ()) for c in kw["constraints"].values()}
    assert types == ({("table_wise",)} if "--no-splits" in flags else {()})


def test_a_global_batch_that_does_not_divide_names_both_numbers(files, capsys, run_cli):
    doc = json.loads((files / "task.json").read_text())
    (files / "odd.json").write_text(json.dumps({**doc, "global_batch_size": 256}))
    assert run_cli(["plan", str(files / "odd.json")]) == 2
    err = capsys.readouterr().err
    assert "global_batch_size 256" in err and "num_devices 3" in err
    assert "such as 255 or 258" in err  # the nearest multiples


def test_budget_and_store_without_calibrate_are_refused(files, capsys, run_cli):
    argv = ["plan", str(files / "task.json"), "--budget-s", "5"]
    assert run_cli(argv) == 2
    assert "--budget-s and --store apply to --calibrate" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("flag", [None, "--no-calibrate", "--calibrate"])
def test_plan_calibrates_by_default_where_the_checkpoint_misprices_this_machine(
    files, monkeypatch, capsys, run_cli, flag
):
    """Here this machine runs the reference kernel 10x slower than the checkpoint predicts:
    by default `dreamshard plan` calibrates (and says why); --no-calibrate never does."""
    from torchrec_dreamshard.calibration import auto
    from torchrec_dreamshard.planner.steps import machine_sources

    agent = DreamShard.untrained(seed=0)
    fwd, bwd = auto.check_machine(agent, None).predicted_ms
    monkeypatch.setattr(
        machine_sources, "load_reference_ms", lambda device="cpu": (10 * fwd, 10 * bwd)
    )
    out = files / "plan.json"
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "agent.pt")]
    argv += ["--out", str(out)]
    if flag == "--calibrate":  # the automatic calibration's budget and store are fixed
        argv += ["--budget-s", "5", "--store", str(files / "cal.sqlite")]
    assert run_cli([*argv, *([flag] if flag else [])]) == 0
    printed = capsys.readouterr().out
    adaptation = json.loads(out.read_text())["adaptation"]
    assert adaptation["mode"] == {None: "auto", "--no-calibrate": "off"}.get(flag, "on")
    # on a busy machine the drift check may discard every kernel calibration measured:
    # the plan is then the checkpoint's, and the notes say why
    notes = " ".join(adaptation.get("measuring_notes", []))
    calibrated = adaptation["calibrated"] or "calibration kept no kernel" in notes
    assert calibrated is (flag != "--no-calibrate")
    if flag is None:
        assert adaptation["reference_error"] == pytest.approx(-0.9)
        assert "calibrating on this machine" in printed
    if adaptation["calibrated"] and adaptation["kernels_discarded"]:
        # the machine changed speed while calibrating (the reference kernel drifted):
        # what was measured is not learned, and the output says so
        assert "drifted" in adaptation["calibration_note"]
        assert adaptation["calibration_note"] in printed
    elif adaptation["calibrated"]:
        assert adaptation["kernel_mape_after"] < adaptation["kernel_mape_before"]


def test_plan_weighs_torchrecs_candidate(files, monkeypatch, run_cli):
    """`dreamshard plan` hands the planner side's candidate sources to the agent."""
    from torchrec_dreamshard.planner.stages.candidates import TorchRecOwnPlan
    from torchrec_dreamshard.policy import NoPlanError

    def probe(self, task):
        raise NoPlanError("asked")

    monkeypatch.setattr(TorchRecOwnPlan, "propose", probe)
    out = files / "plan.json"
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "agent.pt")]
    assert run_cli([*argv, "--no-splits", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["candidates"]["no_plan"]["torchrec_ours"] == "asked"


def test_plan_search_mode(files, monkeypatch, run_cli):
    """``--mode search --num-samples 4 --seed 5`` reach the policy's every placement, and
    the plan holds the placement it made last."""
    calls, placed = [], []
    place = DreamShard.place

    def spy(self, task, mode="greedy", num_samples=16, seed=0, **kwargs):
        calls.append((mode, num_samples, seed))
        placement = place(self, task, mode, num_samples, seed, **kwargs)
        placed.append({t.name: d for t, d in zip(task.tables, placement, strict=True)})
        return placement

    monkeypatch.setattr(DreamShard, "place", spy)
    out = files / "plan.json"
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "agent.pt")]
    argv += ["--mode", "search", "--num-samples", "4", "--seed", "5", "--no-calibrate"]
    assert run_cli([*argv, "--out", str(out)]) == 0
    assert calls and set(calls) == {("search", 4, 5)}
    plan = json.loads(out.read_text())["placement"]
    assert plan and plan == {name[1:]: d for name, d in placed[-1].items() if name[1:] in plan}


def test_plan_errors_name_the_input(files, capsys, run_cli):
    assert run_cli(["plan", str(files / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "nope.pt")]
    assert run_cli(argv) == 2
    assert "nope.pt" in capsys.readouterr().err


BASE = {
    "num_devices": 2,
    "memory_bytes": 10**9,
    "global_batch_size": 512,
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
        (_variant(global_batch_size=10**18), "global_batch_size must be at most"),
        (_variant(hosts=2), "'hosts' without 'local_world_size'"),
        (_variant(hosts=2, local_world_size=2), "num_devices 2 is not hosts 2 x"),
        (_variant(compute_device="tpu"), "compute_device must be one of"),
        (_variant(local_world_size=3), "not a whole number of hosts"),
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

    monkeypatch.setattr(plan_cli, "plan_summary_dict", boom)
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "agent.pt")]
    assert run_cli(argv) == 2
    assert "Permission denied: 'somewhere.json'" in capsys.readouterr().err
    with pytest.raises(PermissionError):
        run_cli([*argv, "--debug"])


def test_non_finite_prediction_names_the_tables():
    from torchrec_dreamshard.planner.plans.plan_prediction import PlanPrediction
    from torchrec_dreamshard.planner.plans.plan_summary import check_finite

    nan = float("nan")
    bad = PlanPrediction([nan, 1.0, 1.0], [1.0] * 3, [1.0] * 3, [0.0] * 3, nan)
    with pytest.raises(ValueError, match=r"not finite.*\['t0', 't3'\]"):
        check_finite(bad, [["t0", "t3"], ["t1", "t4"], ["t2", "t5"]])
    check_finite(PlanPrediction([1.0], [1.0], [1.0], [0.0], 3.0), [["t0"]])  # finite: passes


def test_plan_splits_a_table_too_big_for_every_device(tmp_path, capsys, run_cli):
    # TorchRec's narrowest column-wise shard is 128 columns (MIN_CW_DIM): 4 shards of 512
    tables = [TableSpec(name="big", rows=10_000, dim=512, pooling_factor=4.0)] + [
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
    assert cols[0][0] == 0 and cols[-1][1] == 512
    assert all(a[1] == b[0] for a, b in zip(cols, cols[1:], strict=False))
    assert all(d["bytes"] <= d["memory_bytes"] for d in plan["per_device"])
    assert run_cli([*argv, "--no-splits"]) == 2
    assert "bigger than every device" in capsys.readouterr().err


def test_the_planner_verifies_by_default_only_where_it_calibrates_automatically():
    """The verification ``dreamshard plan`` gets through the planner: ``--verify K`` as
    given, else automatic (2 plans within 25 s, cached) only where the automatic check
    calibrates."""
    from torchrec_dreamshard.calibration import VerificationSettings, VerifyOptions
    from torchrec_dreamshard.calibration.auto import (
        AUTO_VERIFY_K,
        AUTO_VERIFY_S,
        verification_settings,
    )

    auto = VerifyOptions(budget_s=AUTO_VERIFY_S, cache=True, incumbent="chosen")
    assert verification_settings(None, True) == VerificationSettings(AUTO_VERIFY_K, None, auto)
    assert verification_settings(None, False) == VerificationSettings(0)  # priced right
    assert verification_settings(3, False) == VerificationSettings(3)  # --verify 3
    assert verification_settings(3, False, rounds=5).options.rounds == 5  # --verify-rounds


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
    assert margins["measured"] and margins["line"] == line
    assert any(p["torchrec"] and len(p["rounds_ms"]) == 2 for p in plan["verification"]["plans"])
    if plan["verification"]["plans"][0]["torchrec"]:  # the kept plan is TorchRec's own
        assert "kept TorchRec's plan" in line or "the same as TorchRec's" in line
    else:
        assert margins["vs_torchrec"] < 1.0 and "faster than TorchRec's" in line
    # without verification nothing is measured, and the line says what the plan was kept
    # on: the cost network's prediction against TorchRec's plan, not measured
    assert run_cli(argv) == 0
    printed = capsys.readouterr().out
    assert not any(x.startswith("verified ") for x in printed.splitlines())
    kept = [x for x in printed.splitlines() if x.startswith("kept ")]
    assert len(kept) == 1 and "(not measured)" in kept[0], kept
    assert not json.loads(out.read_text())["adaptation"]["margins"]["measured"]


class FakeClock:
    """A clock the verification reads (FAKE: no kernel is timed): each measured step of
    a plan takes :attr:`STEP_S` seconds on it."""

    STEP_S = 1.0

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def step_ms(self, task: Task, placement: list[int]) -> float:
        self.now += self.STEP_S
        return 10.0 + sum(d * (i + 1) for i, d in enumerate(placement)) % 7


def test_plans_the_budget_left_unmeasured_are_written_as_not_measured(
    files, monkeypatch, capsys, run_cli
):
    """A verification whose budget (2 s, one step 1 s on a clock the test controls) leaves
    plans unmeasured: the plan is written as strict JSON, the plans left out are
    ``"measured": false`` with ``"measured_ms": null`` and named in ``not_measured``, and
    the printed table says "not measured" (it was a NaN that refused to be written)."""
    import dataclasses

    from torchrec_dreamshard.io import read_json
    from torchrec_dreamshard.planner.steps import plan_agent
    from torchrec_dreamshard.verification import verification

    clock, settings = FakeClock(), plan_agent.verification_settings
    timing = verification.Timing(clock.step_ms, lambda: 1.0, clock.perf_counter)
    monkeypatch.setattr(verification, "kernel_timing", lambda config: timing)

    def small_budget(*args, **kwargs):
        given = settings(*args, **kwargs)
        return dataclasses.replace(given, options=dataclasses.replace(given.options, budget_s=2.0))

    monkeypatch.setattr(plan_agent, "verification_settings", small_budget)
    out = files / "plan.json"
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "agent.pt")]
    argv += ["--no-calibrate", "--no-splits", "--verify", "4", "--out", str(out)]
    assert run_cli(argv) == 0
    printed = capsys.readouterr().out
    ver = read_json(out, "plan")["verification"]  # strict: a NaN would be refused here
    left = [p for p in ver["plans"] if not p["measured"]]
    assert left and ver["left_out"] == len(left)
    assert ver["not_measured"] == [p["name"] for p in left]
    assert all(p["measured_ms"] is None and p["rounds_ms"] == [] for p in left)
    assert all(p["measured_ms"] > 0 for p in ver["plans"] if p["measured"])
    assert printed.count("not measured") >= len(left)
    assert f"verified {len(ver['plans']) - len(left)} of {len(ver['plans'])} plans" in printed


def test_plan_from_a_profile_times_nothing(files, run_cli, tmp_path):
    """``--profile``: the plan comes from a profile file, with nothing timed."""
    from torchrec_dreamshard.measure.gate import no_measuring
    from torchrec_dreamshard.profile.machine_profile import MachineProfile
    from torchrec_dreamshard.profile.stamp import MachineStamp

    path = tmp_path / "machine.profile"
    MachineProfile(stamp=MachineStamp.here("cpu", 3, 3)).save(path)
    argv = ["plan", str(files / "task.json"), "--profile", str(path)]
    with no_measuring("a plan from a profile times nothing"):
        assert run_cli([*argv, "--out", str(tmp_path / "plan.json")]) == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["adaptation"]["profile_given"]
