"""Column-wise splits: the default plan with splits allowed against the table-wise-only
plan, measured on real kernels, on memory-tight tasks and on tasks with wide tables.

Tasks: the ``tight`` family's test tasks (memory 1.05x or 1.2x the task's bytes / D, as
drawn) and the same tables at 1.05x; the held-out ``wide`` family's test tasks (dims
256-1024, as drawn), where one table can outweigh a device's share; and those of all
these tasks that, at exactly 1.05x the bytes / D, hold a table bigger than every device
(no table-wise plan exists; the sampler's rule would have given a device room for it).
Each task is planned by:

- **whole**: ``agent.place`` with the agent's default mode (whole tables only; may find no
  plan when memory is tight);
- **split**: :func:`torchrec_dreamshard.policy.split_search.plan_with_splits` with the same mode
  (splits a table when it fits no device, when whole tables cannot be packed, or when the
  cost network predicts a faster plan);
- **forced** (tight tasks only): the table that takes the most memory cut in two and the
  task of shards placed by the policy, whatever the cost network says: whether loosening
  the packing would pay where the search does not split;
- the four proxy heuristics, only to count the tasks on which they find no plan.

Both plans of every task are measured in R interleaved rounds (each round visits the tasks
and their plans, the orders rotated round by round; a plan with shards is measured as the
task of its shards). A task's figure is the median over rounds of split / whole, for
**compute** (max over devices of the fused forward + backward) and **step** (plus the
local backend's all-to-all model). When the split search keeps every table whole the two
plans are the same and the ratio is 1 without a second measurement. Also reported: the
seconds ``plan_with_splits`` takes on 1000 tables x 64 devices (one run), and what a
shard costs: every table measured alone, then for each task's three costliest tables the
measured fwd + bwd of one of its two half-width shards over the whole table's, and the
costliest table's time over a device's even share of the sum (a split can only pay where a
table outweighs what splitting adds).

Raw results go to ``results/splits_raw.json`` (``splits_quick_raw.json`` with ``--quick``)
after every round, the summary to ``results/splits.md``.

Usage: python benchmarks/splits.py [--tasks 6] [--wide 8] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from torchrec_dreamshard.data import families
from torchrec_dreamshard.data.sampler import make_task
from torchrec_dreamshard.data.splits import plan_entries
from torchrec_dreamshard.data.tasks import NoPlanError
from torchrec_dreamshard.evaluation.placers import place, single_ms
from torchrec_dreamshard.planner.stages.candidates import default_sources
from torchrec_dreamshard.policy.checkpoint import load_checkpoint
from torchrec_dreamshard.policy.heuristics import HEURISTICS
from torchrec_dreamshard.policy.split_search import plan_with_splits

from harness.family_statistics import geomean
from harness.plan_measuring import measure_costs
from harness.results_files import RESULTS, machine, write

TIGHT = 1.05  # the memory factor every tight task is also planned at
PLANS = ("whole", "split", "forced")  # forced: tight tasks only (forced_split)


def bench_tasks(tight: int, wide: int) -> list[tuple[str, object]]:
    """``(label, task)``: the tight family's first ``tight`` test tasks, as drawn and at
    1.05x, then the wide family's first ``wide``; labels are ``family/group/k``."""
    out = []
    for k in range(tight):
        task = families.draw_task("tight", "test", k)
        factor = task.memory[0] * task.num_devices / task.total_bytes
        out.append((f"tight/{factor:.2f}x/{k}", task))
        at = make_task(task.tables, task.num_devices, task.batch_size, TIGHT)
        out.append((f"tight/{TIGHT:.2f}x/{k}", at))
    out += [(f"wide/as drawn/{k}", families.draw_task("wide", "test", k)) for k in range(wide)]
    return out + oversized(out)


def oversized(tasks: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """The tasks above again at exactly 1.05x the bytes / D, where that leaves a table
    bigger than every device (the sampler's rule gives a device room for the largest table,
    so these tasks have no table-wise plan at all): ``family/oversized 1.05x/k``."""
    from torchrec_dreamshard.data.tasks import Task

    out, seen = [], set()
    for label, task in tasks:
        cap = int(math.ceil(TIGHT * task.total_bytes / task.num_devices))
        if max(t.size_bytes for t in task.tables) <= cap or tuple(task.names) in seen:
            continue
        seen.add(tuple(task.names))
        family, _, k = label.split("/")
        at = Task(
            tables=list(task.tables),
            num_devices=task.num_devices,
            memory_bytes=cap,
            batch_size=task.batch_size,
            allow_oversized=True,
        )
        out.append((f"{family}/oversized {TIGHT:.2f}x/{k}", at))
    return out


def shard_overhead(task, config, top: int = 3) -> dict:
    """Every table of ``task`` measured alone (fwd + bwd): the costliest one's time and a
    device's even share of their sum, and for the ``top`` costliest tables that TorchRec's
    rule lets be halved, the whole table's time and one half shard's."""
    from torchrec_dreamshard.data.splits import column_shards, split_counts

    def cost(spec) -> float:
        return single_ms(spec, task.batch_size, config)

    whole = sorted(((cost(t), t) for t in task.tables), key=lambda x: -x[0])
    out = {
        "max_ms": whole[0][0],
        "share_ms": sum(ms for ms, _ in whole) / task.num_devices,
        "tables": [],
    }
    for ms, spec in whole:
        if len(out["tables"]) == top:
            break
        if 2 in split_counts(spec):
            half = cost(column_shards(spec, 2)[0])
            out["tables"].append(
                {"table": spec.name, "dim": spec.dim, "whole_ms": ms, "half_ms": half}
            )
    return out


def forced_split(agent, task) -> dict | None:
    """The plan with the table taking the most memory cut in two (``None`` if none can
    be, or the policy finds no placement): does loosening the packing pay?"""
    from torchrec_dreamshard.data.splits import shard_task, split_counts

    for spec in sorted(task.tables, key=lambda t: -t.size_bytes):
        if 2 in split_counts(spec, task.num_devices):
            sharded = shard_task(task, {spec.name: 2})
            try:
                placement = [int(d) for d in agent.place(sharded.shards)]
            except ValueError:
                return None
            return {"task": sharded.shards.to_dict(), "placement": placement}
    return None


def plan_both(agent, label: str, task) -> dict:
    """Both plans (``None`` where none is found), the heuristics' misses and the seconds."""
    entry: dict = {"plans": {}, "secs": {}, "heuristics_without_plan": []}
    t0 = time.perf_counter()
    try:
        entry["plans"]["whole"] = {"task": None, "placement": agent.place(task)}
    except ValueError as exc:
        entry["plans"]["whole"], entry["whole_error"] = None, str(exc)
    entry["secs"]["whole"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        found = plan_with_splits(agent, task)
    except ValueError as exc:
        entry["plans"]["split"], entry["split_error"], entry["counts"] = None, str(exc), {}
        entry["predicted"] = {}
        return _heuristic_misses(entry, task)
    entry["secs"]["split"] = time.perf_counter() - t0
    whole, shards = plan_entries(found.sharded, found.placement)
    entry["plans"]["split"] = {
        "task": found.sharded.shards.to_dict() if shards else None,
        "placement": found.placement,
        "plan": {"placement": whole, "shards": shards},
    }
    entry["predicted"] = {"whole": found.whole_ms, "split": found.predicted_ms}
    entry["counts"] = found.sharded.counts
    if label.startswith("tight/"):
        entry["plans"]["forced"] = forced_split(agent, task)
    return _heuristic_misses(entry, task)


def _heuristic_misses(entry: dict, task) -> dict:
    for name in HEURISTICS:
        try:
            place(name, task)
        except NoPlanError:
            entry["heuristics_without_plan"].append(name)
    return entry


def task_of_plan(task, plan: dict):
    from torchrec_dreamshard.data.tasks import Task

    return task if plan["task"] is None else Task.from_dict(plan["task"], allow_oversized=True)


def same_plans(entry: dict) -> bool:
    """Whether the split search kept every table whole and the whole plan's placement."""
    whole, split = entry["plans"]["whole"], entry["plans"]["split"]
    if whole is None or split is None or entry["counts"]:
        return False
    return whole["placement"] == split["placement"]


def measure_rounds(tasks, raw, config, rounds: int, path: Path) -> None:
    """Every task's plans in interleaved rounds (``measure_in_rounds``), appended to each
    task's rounds; a split plan that is the whole plan is measured once and given both
    names. The raw results are written after every round."""
    from torchrec_dreamshard.measure import measure_in_rounds

    entries = raw["tasks"]
    keys = [
        [
            n
            for n in PLANS
            if entry["plans"].get(n) is not None and not (n == "split" and same_plans(entry))
        ]
        for entry in entries
    ]

    def measure(ti: int, name: str) -> dict:
        plan = entries[ti]["plans"][name]
        return measure_costs(task_of_plan(tasks[ti][1], plan), plan["placement"], config)

    def keep(ti: int, r: int, result: dict) -> None:
        if same_plans(entries[ti]):
            result["split"] = result["whole"]
        entries[ti]["rounds"].append(result)

    def save(r: int) -> None:
        path.write_text(json.dumps(raw) + "\n")
        print(f"round {r + 1}/{rounds} measured", flush=True)

    measure_in_rounds(keys, measure, rounds, on_group=keep, on_round=save)


def planning_seconds(agent, tables: int = 1000, devices: int = 64) -> float:
    """Seconds of ``plan_with_splits`` on ``tables`` DLRM-shaped pool tables (CPU scale) on
    ``devices`` devices at 1.2x memory (one run, as ``benchmarks/planning_time.py`` does)."""
    from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool

    pool = synthetic_pool(num_tables=tables, scale=CPU_POOL_SCALE, seed=0)
    task = make_task(pool, devices, 2048, 1.2)
    t0 = time.perf_counter()
    plan_with_splits(agent, task)
    return time.perf_counter() - t0


def task_row(label: str, entry: dict) -> dict:
    """One task's figures: which plans were found, the splits, and the medians over rounds
    of split / whole and forced / whole."""
    row = {
        "task": label,
        "whole_found": entry["plans"]["whole"] is not None,
        "split_found": entry["plans"]["split"] is not None,
        "counts": entry["counts"],
        "heuristics_without_plan": entry["heuristics_without_plan"],
        "secs": entry["secs"],
    }
    for kind in ("compute", "step"):
        if row["whole_found"] and row["split_found"]:
            ratios = [r["split"][kind] / r["whole"][kind] for r in entry["rounds"]]
            row[kind] = float(np.median(ratios))
        if row["whole_found"] and entry["plans"].get("forced"):
            ratios = [r["forced"][kind] / r["whole"][kind] for r in entry["rounds"]]
            row[f"forced_{kind}"] = float(np.median(ratios))
    return row


def group_summary(rs: list[dict]) -> dict:
    """One family and memory level's geomeans and counts."""
    return {
        "tasks": len(rs),
        "compute": geomean([r.get("compute") for r in rs]),
        "step": geomean([r.get("step") for r in rs]),
        "forced_compute": geomean([r.get("forced_compute") for r in rs]),
        "split_tasks": sum(bool(r["counts"]) for r in rs),
        "no_whole_plan": sum(not r["whole_found"] for r in rs),
        "split_rescued": sum(r["split_found"] and not r["whole_found"] for r in rs),
        "heuristic_misses": sum(len(r["heuristics_without_plan"]) for r in rs),
    }


def overhead_lines(tasks, raw) -> list[str]:
    """The table of what a shard costs, one line per family."""
    lines = [
        "| family | tables | half shard / whole | tasks | costliest table / device share |",
        "|---|---:|---:|---:|---:|",
    ]
    for fam in dict.fromkeys(label.split("/")[0] for label, _ in tasks):
        measured = [
            entry["shard_overhead"]
            for (label, _), entry in zip(tasks, raw["tasks"], strict=True)
            if label.startswith(fam + "/") and "shard_overhead" in entry
        ]
        halves = [o["half_ms"] / o["whole_ms"] for m in measured for o in m["tables"]]
        shares = [m["max_ms"] / m["share_ms"] for m in measured]
        if halves:
            lines.append(
                f"| {fam} | {len(halves)} | {np.median(halves):.2f} "
                f"[{min(halves):.2f}, {max(halves):.2f}] | {len(shares)} | "
                f"{np.median(shares):.2f} [{min(shares):.2f}, {max(shares):.2f}] |"
            )
    return lines


def summarise(tasks, raw) -> tuple[dict, str]:
    rows, by_factor = [], {}
    for (label, _), entry in zip(tasks, raw["tasks"], strict=True):
        rows.append(task_row(label, entry))
        by_factor.setdefault(" ".join(label.split("/")[:2]), []).append(rows[-1])
    lines = [
        "# Column-wise splits on memory-tight and wide tasks",
        "",
        f"{len(tasks)} tasks, {raw['settings']['rounds']} interleaved round(s); checkpoint: "
        f"{raw['settings']['checkpoint']}. Produced by `benchmarks/splits.py`"
        + (" `--quick` (a smoke run, not a result)." if raw["settings"]["quick"] else "."),
        "",
        "Ratio = split plan / table-wise plan, median over rounds, geomean over the tasks "
        "where a table-wise plan exists (< 1: splitting is faster).",
        "",
        "| family, memory | tasks | split / whole (compute) | split / whole (step) | tasks split "
        "| no table-wise plan | ... of which split found one | heuristics without a plan "
        "| forced: biggest table halved / whole (compute) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    summary = {factor: group_summary(rs) for factor, rs in by_factor.items()}
    for factor, s in summary.items():
        lines.append(
            f"| {factor} | {s['tasks']} | {s['compute']:.3f} | {s['step']:.3f} | "
            f"{s['split_tasks']} | {s['no_whole_plan']} | {s['split_rescued']} | "
            f"{s['heuristic_misses']} of {4 * s['tasks']} | {s['forced_compute']:.3f} |"
        )
    lines += [
        "",
        f"Planning 1000 tables x 64 devices with splits: {raw['planning_1000x64_s']:.2f} s.",
        "",
        "Forced: the plan with the table that takes the most memory cut in two and the "
        "task of shards placed by the policy (tight tasks only): whether loosening the "
        "packing pays when the planner does not split.",
        "",
        "What a shard costs (each task's tables measured alone): one half-width shard's "
        "fwd + bwd over its whole table's, for the three costliest tables, and the "
        "costliest table's over a device's even share of all of them (median [range]). A "
        "split adds the other half's cost again, so it pays only where a table outweighs "
        "that.",
        "",
        *overhead_lines(tasks, raw),
    ]
    summary["shard_overhead"] = [e.get("shard_overhead", []) for e in raw["tasks"]]
    return {"rows": rows, "by_memory": summary}, "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=6, help="tight family test tasks")
    ap.add_argument("--wide", type=int, default=8, help="wide family test tasks")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--checkpoint", default=None, help="agent checkpoint (default: bundled)")
    ap.add_argument("--quick", action="store_true", help="1 task, 1 short round (a smoke run)")
    args = ap.parse_args()
    from torchrec_dreamshard.measure import MeasureConfig

    config = MeasureConfig()
    if args.quick:
        args.tasks, args.wide, args.rounds = 1, 1, 1
        config = MeasureConfig(warmup=1, iters=2, rounds=1)
    agent = load_checkpoint(args.checkpoint, sources=default_sources())
    tasks = bench_tasks(args.tasks, args.wide)
    settings = {
        "tasks": args.tasks,
        "wide": args.wide,
        "rounds": args.rounds,
        "quick": args.quick,
        "checkpoint": args.checkpoint or "bundled",
        "measure": config.to_dict(),
    }
    raw: dict = {"settings": settings, "machine": machine(), "tasks": []}
    seen: set[tuple[str, ...]] = set()
    for label, task in tasks:
        entry = plan_both(agent, label, task)
        entry["rounds"] = []
        if tuple(task.names) not in seen:  # the tight tasks at 1.05x repeat their tables
            seen.add(tuple(task.names))
            entry["shard_overhead"] = shard_overhead(task, config)
        raw["tasks"].append(entry)
        print(f"{label}: planned, splits {entry['counts'] or 'none'}", flush=True)
    raw["planning_1000x64_s"] = planning_seconds(agent)
    name = "splits_quick" if args.quick else "splits"
    path = RESULTS / f"{name}_raw.json"
    measure_rounds(tasks, raw, config, args.rounds, path)
    summary, text = summarise(tasks, raw)
    write(name, {"settings": settings, **summary}, text)


if __name__ == "__main__":
    main()
