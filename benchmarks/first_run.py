"""A new user's first run: how much a cold cache adds to planning under torchrun.

Each round launches the TorchRec DLRM job of ``tests/torchrun_job.py`` (the default
``DreamShardPlanner``, ``collective_plan`` on the job's process group, then a few training
steps under DistributedModelParallel) with ``torchrun --standalone`` twice on one fresh,
empty cache directory: first cold (the planner measures the collectives, the dense and
reference kernels on the job's ranks, and calibrates where the checkpoint misprices this
machine), then warm (everything from the cache and the calibration store). The figure is
rank 0's wall time of constructing the planner and ``collective_plan``.

    .venv/bin/python benchmarks/first_run.py                 # 2 and 4 ranks, 3 rounds
    .venv/bin/python benchmarks/first_run.py --ranks 2 --rounds 1

Writes ``benchmarks/results/first_run.json`` (raw rows, after every cold/warm pair; a
re-run on the same CPU model resumes) and ``first_run.md`` (medians).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchrec_dreamshard.measure.hardware import cpu_name

from harness.results_files import RESULTS

JOB = Path(__file__).resolve().parent.parent / "tests" / "torchrun_job.py"


def launch(world: int, cache: Path, out: Path) -> dict:
    """One torchrun launch of the job; rank 0's result, with every rank's plan checked."""
    out.mkdir(parents=True)
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc_per_node={world}", str(JOB), str(out)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"the {world}-rank job failed:\n{proc.stderr[-3000:]}")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    if any(r["plan"] != ranks[0]["plan"] for r in ranks):
        raise RuntimeError(f"the {world}-rank job's ranks got different plans")
    first = ranks[0]
    return {
        "plan_s": first["plan_s"],
        "job_s": wall,
        "types": first["types"],
        "adaptation": first["adaptation"],
        "final_loss": first["losses"][-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "first_run"))
    args = parser.parse_args()
    raw = Path(args.out + ".json")
    report = {"cpu": cpu_name(), "cores": os.cpu_count(), "rows": []}
    if raw.exists():  # an interrupted run resumes: its finished (cold, warm) pairs are kept
        kept = json.loads(raw.read_text())
        if kept.get("cpu") == report["cpu"]:
            report["rows"] = kept["rows"]
    rows = report["rows"]
    for round_ in range(args.rounds):
        for world in args.ranks:
            if any(r["round"] == round_ and r["ranks"] == world for r in rows):
                continue
            with tempfile.TemporaryDirectory() as tmp:
                cache = Path(tmp) / "cache"
                pair = []
                for state in ("cold", "warm"):
                    row = launch(world, cache, Path(tmp) / state)
                    row.update(round=round_, ranks=world, cache=state)
                    pair.append(row)
                    print(f"round {round_} {world} ranks {state}: plan {row['plan_s']:.1f} s")
            rows += pair
            raw.write_text(json.dumps(report, indent=1))
    Path(args.out + ".md").write_text(markdown(report, args.ranks))
    print(Path(args.out + ".md").read_text())


def markdown(report: dict, ranks: list[int]) -> str:
    rows = report["rows"]
    lines = [
        "# First run: cold against warm cache, torchrun DLRM job (`benchmarks/first_run.py`)",
        "",
        f"{report['cpu']}, {report['cores']} cores, gloo ranks on one host. Planning wall",
        "time on rank 0 (planner construction + `collective_plan`), median over rounds",
        "[min, max]; each round a fresh empty cache, cold then warm.",
        "",
        "| ranks | cold plan (s) | warm plan (s) | cold - warm (s) | calibrated | "
        "reference error | kernel MAPE before -> after |",
        "|---|---|---|---|---|---|---|",
    ]
    for world in ranks:
        cold = [r for r in rows if r["ranks"] == world and r["cache"] == "cold"]
        warm = [r for r in rows if r["ranks"] == world and r["cache"] == "warm"]
        extra = [c["plan_s"] - w["plan_s"] for c, w in zip(cold, warm, strict=True)]
        a = cold[0]["adaptation"]
        error = a.get("reference_error")
        mape = (
            f"{a['kernel_mape_before']:.0f}% -> {a['kernel_mape_after']:.0f}%"
            if a.get("calibrated")
            else "-"
        )
        lines.append(
            f"| {world} | {_interval([r['plan_s'] for r in cold])} | "
            f"{_interval([r['plan_s'] for r in warm])} | {_interval(extra)} | "
            f"{a.get('calibrated')} | {'-' if error is None else f'{error:+.0%}'} | {mape} |"
        )
    return "\n".join(lines) + "\n"


def _interval(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f} [{min(xs):.1f}, {max(xs):.1f}]"


if __name__ == "__main__":
    main()
