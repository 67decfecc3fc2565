"""Plan time against quality: the default as users run it (``benchmarks/user_path.py``,
``dreamshard plan TASK --timeout B``, every type allowed, an empty cache per task) at
several budgets, each against TorchRec's own plan and the best heuristic that fits the
same storage contract, measured on real kernels in interleaved rounds.

Each budget is one ``user_path.py`` run of its own (``user_path_budget{B}``, resumable);
this script starts the runs it lacks, then writes ``budget_table.md`` and ``.json`` from
their results files. ``--report-only`` starts nothing.

    python benchmarks/budget_table.py                       # 5, 15, 25 and 60 s
    python benchmarks/budget_table.py --families pool wide --budgets 5 25
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from harness.family_statistics import geomean
from harness.results_files import RESULTS, write

BUDGETS = (5.0, 15.0, 25.0, 60.0)
FAMILIES = ("uniform", "unequal", "tall", "wide")
SHARED_SETTINGS = ("families", "per_family", "memories", "rounds")


def run_name(budget: float) -> str:
    return f"user_path_budget{budget:g}"


def start_run(budget: float, args: argparse.Namespace) -> None:
    """One ``user_path.py`` run at ``budget`` (kernel judge only), resumed where it stopped."""
    cmd = [
        sys.executable,
        str(Path(__file__).with_name("user_path.py")),
        "--timeout",
        f"{budget:g}",
        "--name",
        run_name(budget),
        "--no-steps",
        "--rounds",
        str(args.rounds),
        "--per-family",
        str(args.per_family),
        "--memories",
        *args.memories,
        "--families",
        *args.families,
    ]
    print("running", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True)


def run_result(budget: float) -> dict:
    return json.loads((RESULTS / f"{run_name(budget)}.json").read_text())


def run_machine(budget: float) -> dict:
    return run_result(budget)["machine"]


def budget_row(budget: float) -> dict:
    """What the run at ``budget`` measured: geomeans and worst tasks, the plans' wall, and
    the run's own settings and machine (its load at the end)."""
    run = run_result(budget)
    rows = run["rows"]
    row: dict = {
        "budget_s": budget,
        "tasks": len(rows),
        "settings": {k: run["settings"][k] for k in SHARED_SETTINGS},
        "load_average": run["machine"]["load_average"],
    }
    for key in ("vs_best_compute", "vs_torchrec_compute"):
        got = [r[key] for r in rows if r[key]]
        row[key] = {
            "geomean": geomean(got) if got else None,
            "worst": max(got, default=None),
            "measured": len(got),
        }
    walls = [r["plan_s"] for r in rows if r["plan_s"] is not None]
    row["plan_s"] = {
        "median": statistics.median(walls) if walls else None,
        "max": max(walls, default=None),
    }
    return row


def fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def report(rows: list[dict], settings: dict, cores: int) -> str:
    lines = [
        "# Plan time against quality (the default as users run it, every type allowed)",
        "",
        f"Families {', '.join(settings['families'])}, {settings['per_family']} task(s) each, at "
        f"{' and '.join(settings['memories'])} memory, {settings['rounds']} kernel rounds; "
        "each plan `dreamshard plan TASK --timeout B` from an empty cache of its own. "
        "Ratios are medians over rounds of the default's measured compute (the slowest "
        "device's fused forward + backward) over the other plan's; a task counts where both "
        "plans are whole tables table-wise (the kernel judge's rule), so `measured` says on "
        "how many tasks each figure stands. Below 1: the default is faster. The last "
        f"column is each run's load average at its end (1 / 5 / 15 min, {cores} cores).",
        "",
        "| budget (s) | vs best fitting heuristic: geomean (worst) [tasks] | vs TorchRec's "
        "plan: geomean (worst) [tasks] | plan() wall s: median (max) | load at the end |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        b, t, w = r["vs_best_compute"], r["vs_torchrec_compute"], r["plan_s"]
        load = " / ".join(f"{x:.2f}" for x in r["load_average"])
        lines.append(
            f"| {r['budget_s']:g} | {fmt(b['geomean'])} ({fmt(b['worst'])}) [{b['measured']}] "
            f"| {fmt(t['geomean'])} ({fmt(t['worst'])}) [{t['measured']}] "
            f"| {fmt(w['median'], 1)} ({fmt(w['max'], 1)}) | {load} |"
        )
    runs = ", ".join(f"`{run_name(r['budget_s'])}.md`" for r in rows)
    lines += ["", f"Each budget's run: {runs}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", type=float, nargs="*", default=list(BUDGETS))
    ap.add_argument("--families", nargs="*", default=list(FAMILIES))
    ap.add_argument("--memories", nargs="*", default=["own"], choices=("own", "loose"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-family", type=int, default=1)
    ap.add_argument("--report-only", action="store_true", help="start no run")
    args = ap.parse_args(argv)
    if not args.report_only:
        for budget in args.budgets:
            start_run(budget, args)
    rows = [budget_row(b) for b in args.budgets]
    settings = rows[0]["settings"]
    differing = [r["budget_s"] for r in rows if r["settings"] != settings]
    if differing:
        raise SystemExit(
            f"the runs at budgets {differing} were made with other settings than the run at "
            f"{rows[0]['budget_s']:g} s ({settings}); rerun them or leave them out"
        )
    machines = {f"{b:g}": run_machine(b) for b in args.budgets}  # each run's own
    cores = next(iter(machines.values()))["cpu_count"]
    write(
        "budget_table",
        {"settings": settings, "rows": rows, "machines": machines},
        report(rows, settings, cores),
    )


if __name__ == "__main__":
    main()
