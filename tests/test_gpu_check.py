"""``benchmarks/gpu_check.py``: ``prepare`` writes the tasks and TorchRec's plans, and
``run --device cpu`` (CI's mode of the GPU check) measures them and writes its results
and profile with TorchRec hidden; the layers ``run`` needs import without TorchRec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"

# Run first in a subprocess: from there on, importing TorchRec fails as if it were not
# installed (the GPU image ``run`` is for has torch and FBGEMM only).
HIDE_TORCHREC = textwrap.dedent(
    """
    import importlib.abc
    import sys


    class HideTorchRec(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torchrec" or name.startswith("torchrec."):
                raise ModuleNotFoundError(f"No module named {name!r} (hidden)", name=name)
            return None


    sys.meta_path.insert(0, HideTorchRec())
    """
)


def run_hidden(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``code`` in a fresh python with TorchRec hidden and the worktree's package first."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", HIDE_TORCHREC + textwrap.dedent(code)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_torchrec_is_hidden_in_the_subprocess():
    out = run_hidden("import torchrec")
    assert out.returncode != 0 and "(hidden)" in out.stderr


def test_the_measuring_cost_policy_and_calibration_layers_import_without_torchrec():
    out = run_hidden(
        """
        import importlib, pkgutil
        for layer in ("measure", "cost", "policy", "calibration", "profile"):
            package = importlib.import_module(f"torchrec_dreamshard.{layer}")
            for mod in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                importlib.import_module(mod.name)
        assert not any(m.split(".")[0] == "torchrec" for m in sys.modules)
        print("imported")
        """
    )
    assert out.returncode == 0 and "imported" in out.stdout, out.stderr[-3000:]


@pytest.mark.slow
def test_prepare_then_run_on_cpu_without_torchrec_writes_results_and_a_profile(
    tmp_path, comm_model
):
    """``prepare --small`` here (TorchRec at hand), then ``run --device cpu`` with TorchRec
    hidden: every task's plans are measured against TorchRec's and the heuristics', the
    cost network's error is reported before and after calibration, and the profile loads
    as a checkpoint."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(SCRIPT.parent))
    prepared, out = tmp_path / "prepared", tmp_path / "out"
    assert gpu_check.main(["prepare", "--out", str(prepared), "--small"]) == 0
    manifest = json.loads((prepared / "manifest.json").read_text())
    for name in manifest["tasks"]:
        record = json.loads((prepared / f"{name}.json").read_text())
        assert record["torchrec"] is not None and record["heuristics"], name
    argv = ["run", "--in", str(prepared), "--out", str(out), "--device", "cpu"]
    argv += ["--budget-s", "12", "--rounds", "1"]
    done = run_hidden(
        f"""
        import runpy
        sys.argv = [{str(SCRIPT)!r}, *{argv!r}]
        try:
            runpy.run_path({str(SCRIPT)!r}, run_name="__main__")
        except SystemExit as exc:
            assert not exc.code, exc.code
        """,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "5/5 wrote" in done.stdout and "1/5 reference kernel" in done.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["format"] == gpu_check.FORMAT and results["device"] == "cpu"
    assert not results["torchrec_imported"]
    assert results["versions"]["torch"] and results["versions"]["fbgemm_gpu"]
    assert [t["name"] for t in results["tasks"]] == manifest["tasks"]
    for task in results["tasks"]:
        assert task["rounds"] >= 1 and task["failure"] is None, task
        assert task["ours_vs_torchrec"] > 0 and task["ours_vs_best_heuristic"] > 0
    errors = results["cost_error"]["plan_kernels"]
    assert errors["kernels"] > 0 and errors["before"] > 0 and errors["after"] > 0
    assert results["reference_ms"]["fwd"] > 0 and results["failures"] == []

    from torchrec_dreamshard.profile.machine_profile import MachineProfile

    summary = json.loads((out / "profile.json").read_text())
    ref = results["reference_ms"]
    assert summary["reference_ms"] == [ref["fwd"], ref["bwd"]]
    profile = MachineProfile.load(out / summary["file"])  # what a planner plans from
    assert profile.stamp.device == "cpu" and profile.reference_ms == (ref["fwd"], ref["bwd"])


def test_run_on_cuda_without_a_gpu_says_so(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(SCRIPT.parent))
    with pytest.raises(SystemExit, match="no CUDA device"):
        gpu_check.main(["run", "--in", str(tmp_path), "--out", str(tmp_path / "o")])
