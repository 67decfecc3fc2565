"""A user's plain script (no ``if __name__ == "__main__":``) plans a 40-table model on a
CPU topology with a cold cache, and ``plan()`` starts no process but the two ranks that
time the sharding path, fresh interpreters of our own module (``python -m
torchrec_dreamshard.measure.sharding_path_rank``, which never re-imports the script): no
``multiprocessing`` process, no other subprocess, no fork. Each script runs in a
subprocess of its own (the test's, not the planner's) with the venv's python, an empty
``XDG_CACHE_HOME`` and the calibration store inside it, so that everything the first plan
measures is measured there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# The script a user would write, run as it is: at import, with no main guard. Before
# planning it makes every way of starting a process raise but a subprocess of the sharding
# path's rank module (and records each attempt, in case the planner swallowed the error);
# after, it prints the plan, what planning spent and the processes it started. Each run of
# the script's top level appends to RUNS: a rank that re-imported it would add a line.
SCRIPT = textwrap.dedent(
    """
    import json
    import multiprocessing.process
    import os
    import subprocess
    import sys

    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import Topology

    from torchrec_dreamshard import DreamShardPlanner

    WORLD, CALIBRATE = int(sys.argv[1]), {"none": None, "true": 10}[sys.argv[2]]
    with open("RUNS", "a") as runs:
        runs.write("ran\\n")
    started, ours = [], []
    RANK_MODULE = ["-m", "torchrec_dreamshard.measure.sharding_path_rank"]

    def refuse(what):
        def start(*args, **kwargs):
            started.append(what)
            raise RuntimeError(f"plan() started a process: {what}")
        return start

    tables = [
        EmbeddingBagConfig(
            name=f"t{i}",
            embedding_dim=16 * (1 + i % 4),
            num_embeddings=500 * (1 + i % 9),
            feature_names=[f"f{i}"],
        )
        for i in range(40)
    ]
    model = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    # from here on, starting a process raises (constructing the planner included)
    multiprocessing.process.BaseProcess.start = refuse("multiprocessing Process.start")
    real_popen = subprocess.Popen.__init__

    def popen(self, args, *rest, **kwargs):
        if list(args[1:3]) != RANK_MODULE:
            return refuse("subprocess.Popen")(self, args, *rest, **kwargs)
        ours.append(args[2])
        return real_popen(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = popen
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "spawnv"):
        if hasattr(os, name):
            setattr(os, name, refuse(f"os.{name}"))
    planner = DreamShardPlanner(
        topology=Topology(world_size=WORLD, compute_device="cpu"), calibrate=CALIBRATE
    )
    plan = planner.plan(model, [EmbeddingBagCollectionSharder()])
    assert not started, started
    print(plan)
    placed = {name: [p.sharding_type, p.ranks] for name, p in plan.plan[""].items()}
    print("PLACED", json.dumps(placed))
    print("ADAPTATION", json.dumps(planner.adaptation))
    print("OURS", json.dumps(ours))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(("world", "calibrate"), [(2, "none"), (4, "true")])
def test_a_script_without_a_main_guard_plans_on_a_cold_cache_and_starts_only_its_ranks(
    tmp_path, world, calibrate
):
    cache = tmp_path / "cache"
    cache.mkdir()
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(cache),
        "DREAMSHARD_CALIBRATION_STORE": str(cache / "calibration.sqlite"),
    }
    done = subprocess.run(
        [sys.executable, str(script), str(world), calibrate],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "plan() started a process" not in done.stderr
    assert "param | sharding type" in done.stdout  # the plan, printed
    placed, adaptation, ours = (
        json.loads(done.stdout.split(f"{key} ", 1)[1].splitlines()[0])
        for key in ("PLACED", "ADAPTATION", "OURS")
    )
    assert (tmp_path / "RUNS").read_text() == "ran\n"  # the script ran once
    notes = " ".join(adaptation.get("measuring_notes", []))
    # the sharding path's two ranks, once (a cold cache), and no other process; where the
    # automatic check calibrates and keeps the verification's share, the budget may leave
    # the path untimed (it comes last), and the stats then say so
    path_skipped = "sharding path not timed" in notes
    rank = "torchrec_dreamshard.measure.sharding_path_rank"
    assert ours == ([] if path_skipped else [rank] * 2), (ours, notes)
    assert not path_skipped or calibrate == "none", notes  # a plain budget times the path
    # every table placed, each on ranks of the topology
    assert sorted(placed) == sorted(f"t{i}" for i in range(40)), sorted(placed)
    for name, (kind, ranks) in placed.items():
        assert ranks and set(ranks) <= set(range(world)), (name, kind, ranks)
    spent = adaptation["spent_s"]
    # what a cold first plan measured on this machine, each timed on its own
    measured = {"collectives", "dense_kernel", "planning"} | (
        set() if path_skipped else {"sharding_path"}
    )
    # the automatic check times the reference kernel; a budget (10 s) calibrates regardless
    measured |= {"reference_kernel"} if calibrate == "none" else {"calibration"}
    assert measured <= spent.keys(), spent
    assert all(s >= 0 for s in spent.values()) and spent["collectives"] > 0, spent
    names = {p.name for p in (cache / "torchrec_dreamshard").iterdir()}
    assert any(n.startswith("collectives_gloo") for n in names), names
    if calibrate == "true":  # the calibrating path, also without a process
        assert spent["calibration"] > 0, adaptation
        # on a busy machine the drift check may discard every kernel it measured: then the
        # plan is the checkpoint's, and the stats say why
        assert adaptation["calibrated"] or "calibration kept no kernel" in notes, adaptation
        if adaptation["calibrated"]:
            assert adaptation["kernels_measured"] > 0, adaptation
