"""Tests of ``dreamshard collect`` and ``dreamshard evaluate``."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from torchrec_dreamshard.cli import main
from torchrec_dreamshard.data.sampler import make_task
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.device_report import device_table
from torchrec_dreamshard.store import CostStore

FAST = ["--warmup", "1", "--iters", "2", "--rounds", "1"]


@pytest.fixture
def files(tmp_path, comm_model):
    """A small task, a plan, a bad plan and a private comm model cache."""
    tables = [
        TableSpec(name=f"t{i}", rows=2000 * (i + 1), dim=8 * (1 + i % 3), pooling_factor=2.0 + i)
        for i in range(6)
    ]
    task = make_task(tables, 2, 256)
    task.save(tmp_path / "task.json")
    (tmp_path / "plan.json").write_text(
        json.dumps({"placement": {t.name: i % 2 for i, t in enumerate(tables)}})
    )
    (tmp_path / "bad.json").write_text(json.dumps({"placement": {t.name: 0 for t in tables}}))
    return tmp_path


def test_evaluate_prints_per_device_costs(files, capsys):
    rc = main(
        [
            "evaluate",
            str(files / "task.json"),
            str(files / "plan.json"),
            *FAST,
            "--db",
            str(files / "e.sqlite"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == device_table([])[0]  # the per-device table every command prints
    assert lines[1].split()[:2] == ["0", "3"] and float(lines[1].split()[2]) > 0
    assert "step_ms" in lines[3]
    assert CostStore(files / "e.sqlite").count() == 1


def test_evaluate_refuses_a_plan_that_does_not_fit(files, capsys):
    rc = main(["evaluate", str(files / "task.json"), str(files / "bad.json"), *FAST])
    err = capsys.readouterr().err
    assert rc == 2
    assert "device 0 is over its memory" in err and "'t5'" in err and "bad.json" in err


def test_evaluate_names_a_broken_plan_file(files, capsys):
    (files / "broken.json").write_text("{not json")
    assert main(["evaluate", str(files / "task.json"), str(files / "broken.json")]) == 2
    assert "broken.json" in capsys.readouterr().err


def test_evaluate_names_the_tables_of_other_sharding_types(files, capsys):
    """A ``dreamshard plan`` summary whose tables are not all table-wise or column-wise on
    the fused kernel (``"sharding"``) is refused, naming them and their types."""
    plan = {
        "placement": {f"t{i}": i % 2 for i in range(1, 6)},
        "sharding": {"t0": {"sharding_type": "data_parallel", "ranks": [0, 1]}},
    }
    (files / "typed.json").write_text(json.dumps(plan))
    assert main(["evaluate", str(files / "task.json"), str(files / "typed.json")]) == 2
    err = capsys.readouterr().err
    assert "'t0': 'data_parallel'" in err and "--no-splits" in err


def test_collect_fills_the_count_and_a_rerun_skips_done_jobs(files, capsys):
    db = files / "c.sqlite"
    args = [
        "collect",
        "--db",
        str(db),
        "-n",
        "5",
        "--task-file",
        str(files / "task.json"),
        "--no-progress",
        *FAST,
    ]
    assert main(args) == 0
    assert CostStore(db).count(ok=True) == 5
    capsys.readouterr()
    assert main(args) == 0  # the same command again: nothing left to do
    assert "5/5 already in" in capsys.readouterr().out
    assert main([*args[:4], "7", *args[5:]]) == 0  # -n 7 grows the same collection
    assert "5/7 already in" in capsys.readouterr().out
    assert CostStore(db).count() == 7


def test_collect_samples_tasks_when_no_task_file(files):
    db = files / "s.sqlite"
    rc = main(
        [
            "collect",
            "--db",
            str(db),
            "-n",
            "2",
            "--num-tables",
            "3",
            "4",
            "--num-devices",
            "2",
            "--global-batch-size",
            "128",
            "--scale",
            "0.002",
            "--no-progress",
            *FAST,
        ]
    )
    assert rc == 0
    examples = CostStore(db).placement_examples()
    assert len(examples) == 2 and 3 <= len(examples[0].task.tables) <= 4


def _count(db) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            return conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
    except sqlite3.OperationalError:  # table not created yet
        return 0


@pytest.mark.slow
def test_sigkill_loses_no_finished_row_and_resume_completes(files):
    db, n = files / "k.sqlite", 40
    entry = "import sys; from torchrec_dreamshard.cli import main; sys.exit(main())"
    cmd = [
        sys.executable,
        "-c",
        entry,
        "collect",
        "--db",
        str(db),
        "-n",
        str(n),
        "--task-file",
        str(files / "task.json"),
        "--no-progress",
        "--warmup",
        "1",
        "--iters",
        "4",
        "--rounds",
        "2",
    ]
    env = dict(os.environ)
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while _count(db) < 3 and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.05)
    seen_before_kill = _count(db)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL, child.stderr.read().decode()[-2000:]
    assert 3 <= seen_before_kill < n
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        after_kill = conn.execute("SELECT job FROM measurements").fetchall()
    assert len(after_kill) >= seen_before_kill  # nothing committed was lost
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{len(after_kill)}/{n} already in" in done.stdout
    with sqlite3.connect(db) as conn:
        jobs = [r[0] for r in conn.execute("SELECT job FROM measurements")]
    assert len(jobs) == n and len(set(jobs)) == n
    assert {j.split(":")[1] for j in jobs} == {str(i) for i in range(n)}
    assert set(r[0] for r in after_kill) <= set(jobs)


def test_editing_the_task_file_starts_a_new_collection(files, capsys):
    db, task_file = files / "e.sqlite", files / "task.json"
    args = ["collect", "--db", str(db), "-n", "2", "--task-file", str(task_file)]
    args += ["--no-progress", *FAST]
    assert main(args) == 0
    data = json.loads(task_file.read_text())
    data["tables"][0]["pooling_factor"] = 9.5
    task_file.write_text(json.dumps(data))  # same path, new content
    capsys.readouterr()
    assert main(args) == 0
    assert "0/2 already in" in capsys.readouterr().out
    assert CostStore(db).count() == 4


def test_a_store_has_one_collector_at_a_time(files, capsys):
    db = files / "l.sqlite"
    args = ["collect", "--db", str(db), "-n", "1", "--task-file", str(files / "task.json")]
    with CostStore(db) as holder, holder.collector_lock("test holder"):
        assert main([*args, "--no-progress", *FAST]) == 2
        err = capsys.readouterr().err
        assert "being collected into by another process" in err and "test holder" in err
    assert main([*args, "--no-progress", *FAST]) == 0  # released with the block


def test_bad_task_file_and_db_paths_are_one_line(files, capsys):
    (files / "adir").mkdir()
    for argv in (
        ["--task-file", str(files / "adir")],
        ["--task-file", str(files / "task.json"), "--db", str(files / "adir")],
        ["--task-file", str(files / "task.json"), "--db", str(files / "no" / "c.sqlite")],
    ):
        db = [] if "--db" in argv else ["--db", str(files / "x.sqlite")]
        assert main(["collect", *db, *argv, "-n", "1", "--no-progress", *FAST]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and ("adir" in err or "no" in err), err


@pytest.mark.slow
def test_two_concurrent_collectors_lose_and_duplicate_nothing(files):
    """Two `dreamshard collect` on one store: the second is refused at once with a clear
    message while the first runs; every job ends up measured exactly once."""
    db, n = files / "two.sqlite", 30
    entry = "import sys; from torchrec_dreamshard.cli import main; sys.exit(main())"
    cmd = [sys.executable, "-c", entry, "collect", "--db", str(db), "-n", str(n)]
    cmd += ["--task-file", str(files / "task.json"), "--no-progress"]
    cmd += ["--warmup", "1", "--iters", "4", "--rounds", "2"]  # long enough to overlap
    # both start together (same start-up time), so the loser asks while the winner holds
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    codes = sorted(rc for rc, _, _ in results)
    assert codes == [0, 2], [err[-2000:] for _, _, err in results]
    refused = next(err for rc, _, err in results if rc == 2)
    assert "being collected into by another process" in refused
    assert "Traceback" not in refused and refused.count("\n") == 1
    with sqlite3.connect(db) as conn:
        jobs = [r[0] for r in conn.execute("SELECT job FROM measurements")]
    assert len(jobs) == n and len(set(jobs)) == n
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0 and f"{n}/{n} already in" in rerun.stdout


def test_evaluate_measures_a_plan_with_shards(files, capsys):
    shards = {"t2": [{"device": 0, "columns": [0, 12]}, {"device": 1, "columns": [12, 24]}]}
    placement = {f"t{i}": i % 2 for i in range(6) if i != 2}
    (files / "split.json").write_text(json.dumps({"placement": placement, "shards": shards}))
    rc = main(["evaluate", str(files / "task.json"), str(files / "split.json"), *FAST])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.splitlines()[1].split()[:2] == ["0", "3"]  # t0, t4 and t2's first shard
    assert "step_ms" in out


def test_evaluate_refuses_shards_that_miss_columns(files, capsys):
    shards = {"t2": [{"device": 0, "columns": [0, 12]}]}
    placement = {f"t{i}": i % 2 for i in range(6) if i != 2}
    (files / "split.json").write_text(json.dumps({"placement": placement, "shards": shards}))
    assert main(["evaluate", str(files / "task.json"), str(files / "split.json"), *FAST]) == 2
    assert "'t2'" in capsys.readouterr().err
