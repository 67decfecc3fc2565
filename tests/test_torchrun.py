"""A new user's first run: a TorchRec DLRM job launched by ``torchrun`` on 2 gloo ranks,
on an empty cache, planned by the default ``DreamShardPlanner`` through
``collective_plan`` (tests/torchrun_job.py).

On a cold cache the planner measures what it needs on the job's own process group (the
collectives, the dense and reference kernels, and calibration kernels where the checkpoint
misprices this machine). Before, rank 0 spawned processes that inherited torchrun's
rendezvous and the job hung; the launch's timeout catches a hang (no assertion bounds how
long planning took: that is the benchmarks'), and the stats say what the planner did. The
job's next run, on the same cache, measures nothing again and plans alike, on every host
(whether or not the checkpoint priced it right and so calibrated).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

JOB = Path(__file__).with_name("torchrun_job.py")
HARNESS = Path(__file__).resolve().parents[1] / "benchmarks"  # the job's model: harness.dlrm_jobs
WORLD = 2
JOB_TIMEOUT_S = 300  # the whole launch; a hang ends here instead of in CI's limit


def launch(out: Path, cache: Path, world: int = WORLD, profile: Path | None = None) -> list[dict]:
    """Run the job under torchrun with ``cache`` as XDG_CACHE_HOME (and the machine
    profile at ``profile`` where given); every rank's result."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [str(HARNESS), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": os.pathsep.join(paths)}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd = [*launcher, f"--nproc_per_node={world}", str(JOB), str(out)]
    cmd += [str(profile)] if profile is not None else []
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.slow
def test_a_torchrun_job_plans_and_trains_on_a_cold_cache(tmp_path, cold_cache):
    cache = cold_cache  # the test's own, empty
    assert not cache.exists()
    results = launch(tmp_path / "cold", cache)
    first = results[0]
    assert [r["rank"] for r in results] == list(range(WORLD))
    assert all(r["plan"] == first["plan"] for r in results), "ranks got different plans"
    assert all(r["adaptation"] == first["adaptation"] for r in results)
    assert len(first["types"]) == 8
    for r in results:
        assert len(r["losses"]) == 4 and all(math.isfinite(x) for x in r["losses"])
    adaptation = first["adaptation"]
    assert adaptation["mode"] == "auto" and adaptation["reference_measured_ms"] > 0
    # what was measured on the job's group is cached for the next run of this topology
    cached = sorted(p.name.split("_")[0] for p in (cache / "torchrec_dreamshard").glob("*.json"))
    # where it calibrated, it also verified its plan on real kernels (cached per plan set),
    # unless the plan's budget ran out first (a loaded machine): then it says so
    notes = adaptation["measuring_notes"]
    cut_short = adaptation.get("kernels_skipped") or [
        n for n in notes if "skipped" in n or "unmeasured" in n or "not timed" in n
    ]
    verified = ["verification"] if adaptation["verified"] else []
    # the sharding path, timed on the job's group where the budget left time for it
    path = [] if any("sharding path not timed" in n for n in notes) else ["sharding"]
    assert cached == ["collectives", "dense", "reference", *path, *verified], cached
    assert adaptation["verified"] is adaptation["calibrated"] or cut_short, adaptation
    if adaptation["calibrated"]:
        # kernels measured: kept, or discarded where the reference kernel drifted while they
        # were timed (a busy machine: its load is not learnt as this machine's speed)
        measured = adaptation["kernels_measured"] + adaptation["kernels_discarded"]
        assert measured > 0 and not adaptation["verify_cached"]

    # the next run of the job, on every host: it measures nothing again and plans alike
    files = cache_files(cache)
    again = launch(tmp_path / "warm", cache)
    warm = again[0]["adaptation"]
    assert all(r["plan"] == again[0]["plan"] for r in again)  # every rank, one plan
    # the reference kernel's time is the cached one, so the same decision to calibrate
    assert warm["reference_measured_ms"] == adaptation["reference_measured_ms"]
    assert warm["calibrated"] is adaptation["calibrated"]
    if adaptation["calibrated"] and adaptation["kernels_discarded"] or cut_short:
        return  # what the busy machine discarded or had no time for, the warm run measures
    assert again[0]["plan"] == first["plan"]  # the same plan as the cold run
    assert cache_files(cache) == files  # no cached measurement taken or written again
    if adaptation["calibrated"]:  # the same calibration, from the store
        assert warm["kernels_measured"] == 0
        assert warm["kernels_reused"] == adaptation["kernels_measured"]
        assert warm["verify_cached"]  # the verification read from the cache


def cache_files(cache: Path) -> dict[str, bytes]:
    """The per-machine cache files under ``cache`` (the calibration store aside), by name."""
    return {p.name: p.read_bytes() for p in (cache / "torchrec_dreamshard").glob("*.json")}


@pytest.mark.slow
def test_a_job_planned_from_a_profile_measures_nothing_and_plans_alike(tmp_path, cold_cache):
    """A profile (one node measured it; here it is made of the test's fixed models) hands
    every job the same plan: the same on every rank, run after run, on 2 ranks and on 4;
    nothing is measured and nothing written in the job's cache."""
    from conftest import CPU_DENSE_LIKE, GLOO_LIKE, bundled_reference_ms

    from torchrec_dreamshard.profile.machine_profile import MachineProfile
    from torchrec_dreamshard.profile.stamp import MachineStamp

    path = tmp_path / "machine.profile"
    MachineProfile(
        stamp=MachineStamp.here("cpu", 4, 4),
        reference_ms=bundled_reference_ms(),
        collectives=GLOO_LIKE,
        collectives_source="tests: fixed",
        dense_kernel=CPU_DENSE_LIKE,
    ).save(path)
    plans = {}
    for run, world in (("a", 2), ("b", 2), ("c", 4)):
        results = launch(tmp_path / run, cold_cache, world, profile=path)
        assert len({r["plan"] for r in results}) == 1, "ranks got different plans"
        assert all(r["adaptation"]["profile_given"] for r in results)
        plans[run] = results[0]["plan"]
    assert plans["a"] == plans["b"]  # the same job, the same plan, byte for byte
    assert not cold_cache.exists() or not any(cold_cache.rglob("*"))  # nothing written
