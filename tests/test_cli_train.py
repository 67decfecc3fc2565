"""``dreamshard train``: help, a tiny run, resuming after SIGKILL."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time

import pytest

from torchrec_dreamshard.cli import main

TINY = [
    "--num-tables", "5", "8", "--num-devices", "2",
    "--boot-single", "3", "--boot-subsets", "2", "--boot-tasks", "1",
    "--collect-tasks", "1", "--placements-per-task", "3",
    "--policy-updates", "3", "--cost-epochs", "5", "--rounds", "1", "--no-progress",
]  # fmt: skip


def test_help_lists_examples(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--help"])
    assert exc.value.code == 0
    assert "resumes" in capsys.readouterr().out


def test_bad_config_is_a_clean_error(tmp_path, capsys):
    code = main(["train", "--out-dir", str(tmp_path), "--backend", "local", "-n", "-1"])
    assert code == 2
    assert "iterations must be >= 0" in capsys.readouterr().err


def _iterations(out_dir) -> list[int]:
    rows = csv.DictReader((out_dir / "metrics.csv").open())
    return [int(float(r["iteration"])) for r in rows]


@pytest.mark.slow
def test_train_then_resume(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--out-dir", str(out), "-n", "1", *TINY]) == 0
    assert "checkpoint" in capsys.readouterr().out
    assert main(["train", "--out-dir", str(out), "-n", "2", *TINY]) == 0
    assert _iterations(out) == [1, 2]
    assert (out / "curves.png").exists() and (out / "checkpoint_it002.pt").exists()
    from torchrec_dreamshard.policy.checkpoint import load_checkpoint, read_payload

    agent = load_checkpoint(out / "checkpoint.pt")
    assert agent.meta["trained"] and agent.meta["workload"]["optimizer"] == "rowwise_adagrad"
    assert read_payload(out / "checkpoint.pt")["extra"]["iteration"] == 2
    # a different seed cannot silently continue this run
    assert main(["train", "--out-dir", str(out), "-n", "3", "--seed", "1", *TINY]) == 2
    assert "seed" in capsys.readouterr().err


@pytest.mark.slow
def test_resume_after_sigkill(tmp_path):
    out = tmp_path / "run"
    entry = "import sys; from torchrec_dreamshard.cli import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", entry, "train", "--out-dir", str(out)]
    cmd += ["-n", "3", *TINY]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not (out / "checkpoint_it001.pt").exists() and time.time() < deadline:
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (out / "checkpoint_it001.pt").exists()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _iterations(out) == [1, 2, 3]


def _jobs_and_placements(store_path) -> dict[str, list[int]]:
    from torchrec_dreamshard.store import CostStore

    with CostStore(store_path) as store:
        return {ex.meta["job"]: ex.placement for ex in store.placement_examples()}


@pytest.mark.slow
def test_same_seed_same_jobs_and_placements(tmp_path):
    """A run in a fresh process with another string-hash salt and a run in this process,
    each with a fresh store, measure the same jobs with the same placements: job seeds do
    not come from ``hash``."""
    tiny = [
        "-n", "1", "--num-tables", "4", "6", "--num-devices", "2", "--boot-single", "2",
        "--boot-subsets", "1", "--boot-tasks", "1", "--collect-tasks", "1",
        "--placements-per-task", "3", "--policy-updates", "1", "--cost-epochs", "1",
        "--rounds", "1", "--no-progress", "--seed", "3",
    ]  # fmt: skip
    salt = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    entry = "import sys; from torchrec_dreamshard.cli import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", entry, "train", "--out-dir", str(tmp_path / "other"), *tiny]
    env = {**os.environ, "PYTHONHASHSEED": salt}
    other = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert main(["train", "--out-dir", str(tmp_path / "here"), *tiny]) == 0
    _, err = other.communicate(timeout=300)
    assert other.returncode == 0, err.decode()[-2000:]
    here = _jobs_and_placements(tmp_path / "here" / "costs.sqlite")
    assert here == _jobs_and_placements(tmp_path / "other" / "costs.sqlite")
    kinds = {key.split("@")[0].rsplit("-", 1)[-1] for key in here if key.startswith("it0-task")}
    assert kinds == {"0", "1", "2"}  # the greedy, sampled and random placements all compared
