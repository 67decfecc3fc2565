"""Plan time against plan quality: what each budget (``timeout_seconds``) buys.

Each held-out task (the pool's test split, tables the checkpoint never saw) is planned by
``DreamShardPlanner`` with no flags but ``timeout_seconds=B``, for every budget B, each
from an empty cache of its own (``cache_dir``), so a budget's plan knows only what it
measured itself: the machine profile and the verification within B. Its tables are held to
table-wise on the fused kernel (the placements the measurement harness runs, as in the
demo). Beside them, TorchRec's own planner and the simple heuristics plan the same task.
Every distinct plan is then measured on real FBGEMM kernels in interleaved rounds, and
each budget's plan is set against TorchRec's plan and the best heuristic's (the fastest
by median step), per round, with the median ratio and its interval.

Raw results: ``results/plan_budget.json`` (``--name``: another stem; saved after every
task and round, so a rerun with the same settings resumes); summary ``.md`` beside it.

Usage: python benchmarks/plan_budget.py [--budgets 5 15 30 60] [--tasks 4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.evaluation.placers import plan_each
from torchrec_dreamshard.evaluation.step_stats import ratio_interval
from torchrec_dreamshard.measure import MeasureConfig
from torchrec_dreamshard.policy.heuristics import HEURISTICS

from harness.default_planning import plan_whole_tables
from harness.plan_measuring import measure_rounds, plan_key
from harness.results_files import RESULTS, load_raw, machine, save_raw
from harness.task_draws import heldout_tasks

SHAPES = [(20, 4), (40, 4), (60, 8), (80, 8), (30, 4), (50, 8)]  # (tables, devices)
MEMORY_FACTOR = 3.0  # each device's memory over an even share of the tables' bytes


def budget_plan(task: Task, budget: float, cache: Path) -> tuple[list[int], dict]:
    """The default planner's placement of ``task`` within ``budget`` seconds, from an
    empty cache at ``cache``, and what it spent (wall seconds and its adaptation)."""
    out = plan_whole_tables(task, cache, timeout_seconds=budget)
    keep = ("calibrated", "verified", "verify_chosen", "measuring_notes", "spent_s")
    return out.placement, {"wall_s": out.seconds, **{k: out.adaptation.get(k) for k in keep}}


def plan_task_every_way(task: Task, budgets: list[float], seed: int) -> dict:
    """The raw entry of one task: every budget's plan and what it spent, TorchRec's and
    the heuristics' plans."""
    plans, secs = plan_each([*HEURISTICS, "torchrec"], task, seed)
    spent = {}
    for budget in budgets:
        with tempfile.TemporaryDirectory() as cache:
            placement, info = budget_plan(task, budget, Path(cache))
        plans[f"budget_{budget:g}"] = placement
        spent[f"budget_{budget:g}"] = info
        print(f"  budget {budget:g} s: planned in {info['wall_s']:.1f} s", flush=True)
    return {"task": task.to_dict(), "plans": plans, "secs": secs, "spent": spent, "rounds": []}


def step_of(entry: dict, method: str) -> list[float] | None:
    """The measured step of ``method``'s plan, per round (``None``: no plan)."""
    plan = entry["plans"].get(method)
    if plan is None:
        return None
    key = plan_key(plan)
    return [r[key]["step"] for r in entry["rounds"] if key in r]


def summarise(raw: dict) -> str:
    """One row per task and budget: the plan's time, and its measured step against
    TorchRec's plan and the best heuristic's (median ratio [interval])."""
    budgets = raw["settings"]["budgets"]
    lines = [
        "# Plan time against quality: the default planner within timeout_seconds",
        "",
        f"Machine: {raw.get('machine', {}).get('device_name')}; load during the run: "
        f"{raw.get('machine', {}).get('load_average')}. Each budget plans from an empty cache.",
        "Ratios: the budget's plan's measured step over the other plan's, per round; "
        "median [interval]. Below 1.0 is faster.",
        "",
        "| task | budget s | planned in s | vs TorchRec | vs best heuristic | kept |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    geo: dict[str, dict[str, list[float]]] = {}
    for i, entry in enumerate(raw["tasks"]):
        if not entry["rounds"]:
            continue
        shape = f"{len(entry['task']['tables'])}x{entry['task']['num_devices']}"
        steps = {h: step_of(entry, h) for h in HEURISTICS}
        best = min((h for h in steps if steps[h]), key=lambda h: np.median(steps[h]))
        torchrec = step_of(entry, "torchrec")
        for budget in budgets:
            name = f"budget_{budget:g}"
            mine = step_of(entry, name)
            info = entry["spent"][name]
            cells = []
            for other, label in ((torchrec, "torchrec"), (steps[best], "best")):
                if other is None:
                    cells.append("no plan")
                    continue
                r = ratio_interval(mine, other)
                cells.append(f"{r.median:.3f} [{r.low:.3f}, {r.high:.3f}]")
                geo.setdefault(name, {}).setdefault(label, []).append(r.median)
            kept = info.get("verify_chosen") or ("calibrated" if info.get("calibrated") else "-")
            lines.append(
                f"| {i} ({shape}) | {budget:g} | {info['wall_s']:.1f} | {cells[0]} | "
                f"{cells[1]} ({best}) | {kept} |"
            )
    lines += [
        "",
        "| budget s | geomean vs TorchRec | geomean vs best heuristic |",
        "| --- | --- | --- |",
    ]
    for budget in budgets:
        name = f"budget_{budget:g}"
        row = geo.get(name, {})
        cells = [
            f"{float(np.exp(np.mean(np.log(row[k])))):.3f}" if row.get(k) else "-"
            for k in ("torchrec", "best")
        ]
        lines.append(f"| {budget:g} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", type=float, nargs="+", default=[5.0, 15.0, 30.0, 60.0])
    ap.add_argument("--tasks", type=int, default=4, help=f"held-out tasks (of {SHAPES})")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="plan_budget", help="results file stem")
    args = ap.parse_args()
    settings = {"budgets": args.budgets, "tasks": args.tasks, "seed": args.seed}
    path = RESULTS / f"{args.name}.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw = load_raw(path, settings)
    # memory for every table to fit a device whole after TorchRec's storage reservation:
    # the plans are table-wise, as the measurement harness runs them
    tasks = heldout_tasks(SHAPES[: args.tasks], seed=args.seed, memory_factor=MEMORY_FACTOR)
    start = time.perf_counter()
    for i, task in enumerate(tasks[len(raw["tasks"]) :], start=len(raw["tasks"])):
        print(f"task {i}: {len(task.tables)} tables on {task.num_devices} devices", flush=True)
        raw["tasks"].append(plan_task_every_way(task, args.budgets, args.seed + i))
        save_raw(path, raw)
    named = [(str(i), t) for i, t in enumerate(tasks)]
    measure_rounds(named, raw, MeasureConfig(rounds=1), args.rounds, path, start, 0.0)
    raw["machine"] = machine()
    save_raw(path, raw)
    summary = summarise(raw)
    (RESULTS / f"{args.name}.md").write_text(summary + "\n")
    print(summary)


if __name__ == "__main__":
    main()
