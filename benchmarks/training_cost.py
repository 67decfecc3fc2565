"""Training cost: wall time and measured placements to a usable checkpoint on this machine.

Reads a training run's directory (``dreamshard train --out-dir DIR``): its metrics, its
cost store and its checkpoints. Reported per iteration: measurements in the store so far,
collection time, fit and policy time, the cost network's held-out error and the measured
step cost of the greedy plans it collected. The measurement time is taken from the cost
store's timestamps (the sum over rows of the time since the previous row, gaps over 15 s
(fits, policy training, restarts) left out) and the fit-and-policy time from the median
iteration, so a run that was stopped, changed and resumed is costed as one clean pass.

Usage: python benchmarks/training_cost.py [--run-dir runs/cpu_default]
       python benchmarks/training_cost.py --train -n 8   # train first, then report
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

import numpy as np

from harness.results_files import RESULTS, machine, write


def measurement_seconds(db: Path) -> tuple[int, float]:
    """Rows and the measuring time implied by their timestamps."""
    con = sqlite3.connect(str(db))
    stamps = np.array(
        [r[0] for r in con.execute("SELECT created_at FROM measurements ORDER BY id")]
    )
    con.close()
    gaps = np.diff(stamps)
    # one measurement takes < 15 s here; longer gaps are fits, policy training, restarts
    return len(stamps), float(gaps[gaps < 15].sum() + np.median(gaps))


def rows_by_kind(db: Path) -> dict[str, int]:
    """Measured rows by job kind (``boot-single``, ``boot2-subset``, ``it``...)."""
    con = sqlite3.connect(str(db))
    jobs = [r[0] or "" for r in con.execute("SELECT job FROM measurements")]
    con.close()
    kinds: dict[str, int] = {}
    for job in jobs:
        parts = job.split("-")
        kind = "-".join(parts[:2]) if job.startswith("boot") else "iterations"
        if job.startswith("boot") and "task" in parts[1]:
            kind = parts[0] + "-random-placements"
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def iteration_table(rows: list[dict]) -> list[str]:
    """The per-iteration table of the training metrics, and what its columns mean."""
    table = [
        "| iteration | samples | held-out step MAPE % | Kendall tau | greedy plan, measured ms |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        table.append(
            f"| {r['iteration']} | {r.get('data/samples', '')} | "
            f"{float(r.get('cost/mape') or 'nan'):.1f} | "
            f"{float(r.get('cost/kendall_tau') or 'nan'):.2f} | "
            f"{float(r['plan/cost_ms']) if r.get('plan/cost_ms') else float('nan'):.1f} |"
        )
    return table + [
        "",
        (
            "Iterations without a greedy-plan figure measured nothing new: the run was "
            "restarted and the resumable store already held their measurements. "
            if any(not r.get("plan/cost_ms") for r in rows)
            else ""
        )
        + "Greedy-plan cost is the mean measured step cost of that iteration's greedy plans "
        "(new tasks each iteration, so it is noisy); the held-out MAPE is on task groups kept "
        "out of the fit. Curves: training_curves.png (metrics: training_metrics.csv).",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", default="runs/cpu_default")
    ap.add_argument("--train", action="store_true", help="run `dreamshard train` first")
    ap.add_argument("-n", "--iterations", type=int, default=10)
    args = ap.parse_args()
    run = Path(args.run_dir)
    if args.train:
        cmd = ["dreamshard", "train", "--out-dir", str(run), "-n", str(args.iterations)]
        subprocess.run(cmd, check=True)
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    config = json.loads((run / "config.json").read_text())
    n_rows, measure_s = measurement_seconds(run / "costs.sqlite")
    kinds = rows_by_kind(run / "costs.sqlite")
    walls = [float(r["time/wall_s"]) for r in rows]
    per_iter = np.diff([0.0, *walls]) - np.array(
        [float(r.get("collect/wall_s") or 0) for r in rows]
    )
    compute_s = float(np.median(per_iter)) * len(rows)  # fits + policy, one clean pass
    total_s = measure_s + compute_s
    table = [
        "# Training cost",
        "",
        f"Run `{run}`: {len(rows)} iterations, {n_rows} measured placements, by kind: "
        + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
        + f" ({config['collect_tasks']} tasks x {config['placements_per_task']} placements "
        "per iteration"
        + (
            "; `boot2-*` rows are single tables and fused subsets on one device added to the "
            "store by a second bootstrap pass between runs, which is what `--boot-single` / "
            "`--boot-subsets` now default to)."
            if any(k.startswith("boot2") for k in kinds)
            else ")."
        ),
        "",
        f"- measuring: {measure_s / 60:.1f} min (from the store's timestamps)",
        f"- fitting the cost network and training the policy: {compute_s / 60:.1f} min "
        f"({len(rows)} iterations x the median iteration's {compute_s / len(rows):.0f} s)",
        f"- total: **{total_s / 60:.1f} min** on this 2-core machine (target: under 30 min)",
        "",
        *iteration_table(rows),
        machine()["note"],
        "Raw: training_cost.json. Script: benchmarks/training_cost.py.",
    ]
    data = {
        "run_dir": str(run),
        "config": config,
        "measurements": n_rows,
        "measurements_by_kind": kinds,
        "measure_s": measure_s,
        "compute_s": compute_s,
        "total_s": total_s,
        "metrics": rows,
        "machine": machine(),
    }
    write("training_cost", data, "\n".join(table))
    shutil.copyfile(run / "metrics.csv", RESULTS / "training_metrics.csv")
    shutil.copyfile(run / "curves.png", RESULTS / "training_curves.png")


if __name__ == "__main__":
    main()
