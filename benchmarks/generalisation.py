"""Generalisation: placement quality and cost-model accuracy on task families the bundled
checkpoint never saw, each family reported apart.

Families (``torchrec_dreamshard.data.families``) differ from training along one axis each:
access skew, bag-length variance, rows and dims beyond the training ranges, pooling past
100, memory tightness and unequal memory, table and device counts, batch size. The
families in ``HELDOUT_FAMILIES`` are kept out of training entirely.

Every task is planned by: the four proxy heuristics, TorchRec's planner (default storage
reservation), DreamShard's default (safe) plan of whole tables (``agent.place``), the same
with column-wise splits allowed (``dreamshard_split``: ``plan_with_splits``, what
``dreamshard plan`` and ``DreamShardPlanner`` do by default; a split plan is measured as
the task of its shards), its policy's greedy roll-out alone and its search mode,
*measured-greedy* (each table measured alone on real kernels, then the measured costs
balanced greedily: one measurement per table, balanced with the same memory look-ahead as
the safety net's heuristics: the reference for what knowing the hardware buys) and two
random placements (so that the cost network is ranked on at least eight placements per task).

Every distinct plan is then measured in R interleaved rounds (each round visits the tasks
and their plans, the orders rotated round by round). A method's figure on a task is the
median over rounds of its cost divided by the per-task best heuristic's in the same round
(best = the lowest median of the four). Two costs are reported: **compute** = max over
devices of the measured fused forward + backward (the headline: what the placement
controls), and **step** = max over devices of forward + backward + all-to-all (the local
backend's fitted all-to-all model).

The cost network's accuracy per task: Kendall tau between its predicted step and the
measured step (median over rounds) over the task's distinct placements, and the MAPE of
its predictions.

With ``--calibrate-budget B [B ...]`` every task is also planned after calibrating on
this machine with a budget of B seconds (``calibrated_B``: the safe mode of the calibrated
agent) and, with ``--verify K``, after verifying by measuring its K best-rated candidates
and the heuristics' plans (``calibrated_B_verifyK``). Each budget has its own calibration
store (started afresh with the raw results), so a budget's model knows only what it
measured. The calibrated model's tau and MAPE are reported beside the prior's.

With ``--default`` every task is also planned by ``DreamShardPlanner`` with no flags, as
a user's first plan on this machine (``default``: each task from a fresh, empty cache,
within the planner's default budget for a first plan; its tables held to table-wise, the
task's memory given as what a storage reservation left: see
:func:`~harness.method_roster.plan_default`), and
``default_unverified`` is its policy's choice before the verification step. The report
sets each default plan's seconds against that budget.

With ``--busy-core`` another process spins on one core throughout, planning and
measuring (:func:`~harness.busy_core.keep_core_busy`): a user's
machine is rarely idle while they plan.

Raw results are written after every task and every round to
``results/generalisation_raw.json``; a rerun with the same settings resumes from it.

Usage: python benchmarks/generalisation.py [--per-family 3] [--rounds 3] [--quick]
       [--calibrate-budget 30 60] [--verify 4] [--checkpoint PATH] [--default] [--busy-core]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

from torchrec_dreamshard.data import families
from torchrec_dreamshard.measure import MeasureConfig
from torchrec_dreamshard.planner.stages.candidates import default_sources
from torchrec_dreamshard.policy.checkpoint import load_checkpoint

from harness.busy_core import keep_core_busy
from harness.family_report import report
from harness.family_statistics import family_rows, task_summary
from harness.method_roster import (
    calibrated_agents,
    calibration_store,
    methods,
    plan_calibrated,
    plan_default,
    plan_every_method,
)
from harness.plan_measuring import measure_rounds
from harness.results_files import RESULTS, load_raw, machine, save_raw, write
from harness.task_draws import PER_FAMILY, roster


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=None, help="default: the bundled checkpoint")
    ap.add_argument("--per-family", type=int, default=PER_FAMILY)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--families", nargs="*", default=list(families.FAMILIES))
    ap.add_argument("--quick", action="store_true", help="1 task per family, 1 round")
    ap.add_argument("--name", default="generalisation", help="results file stem")
    ap.add_argument(
        "--calibrate-budget",
        type=float,
        nargs="*",
        default=[],
        metavar="S",
        help="also plan after calibrating with each budget (seconds)",
    )
    ap.add_argument("--verify", type=int, default=0, metavar="K", help="and verify K plans")
    ap.add_argument(
        "--default",
        action="store_true",
        help="also plan with DreamShardPlanner and no flags, each task a first plan from an "
        "empty cache within the planner's default budget (whole tables; the task's memory as "
        "what a storage reservation left)",
    )
    ap.add_argument(
        "--busy-core",
        action="store_true",
        help="keep one core busy with another process throughout (planning and measuring)",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.per_family, args.rounds = 1, 1
    return args


def run_settings(args: argparse.Namespace) -> dict:
    """What the raw results were taken with (a rerun resumes only with the same)."""
    settings = {
        "checkpoint": args.checkpoint or "bundled",
        "per_family": args.per_family,
        "families": args.families,
        "seed": args.seed,
        # raw results of another method list are not resumed
        "methods": methods(args.calibrate_budget, args.verify, args.default),
    }
    if args.default:  # not resumed from a run whose default was the standalone agent's
        settings["default"] = "DreamShardPlanner, a fresh cache per task"
    if args.busy_core:  # rounds taken beside a busy core are not mixed with quiet ones
        settings["busy_core"] = True
    if args.calibrate_budget:
        settings["calibrate_budget"] = args.calibrate_budget
        settings["verify"] = args.verify
    return settings


def plan_tasks(agent, tasks, raw: dict, config, args, path: Path) -> None:
    """Plan the tasks ``raw`` does not hold yet (every budget's calibration store started
    afresh with fresh raw results), saving after each."""
    if not raw["tasks"]:  # a fresh run: every budget's calibration starts from nothing
        for budget in args.calibrate_budget:  # the default plans from a fresh cache per task
            store = calibration_store(args.name, budget)
            for suffix in ("", "-wal", "-shm", ".lock"):
                Path(str(store) + suffix).unlink(missing_ok=True)
    for i, (fam, task) in enumerate(tasks):
        if i < len(raw["tasks"]):
            continue
        plans, secs = plan_every_method(agent, task, config, args.seed + i)
        plan_calibrated(agent, task, config, args, args.seed + i, plans, secs)
        if args.default:
            plan_default(agent, task, plans, secs)
        raw["tasks"].append({"family": fam, "plans": plans, "secs": secs, "rounds": []})
        save_raw(path, raw)
        print(f"planned {fam} T={len(task.tables)} D={task.num_devices}", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    agent = load_checkpoint(args.checkpoint, sources=default_sources())
    config = MeasureConfig()
    tasks = roster(args.families, args.per_family, args.seed)
    settings = run_settings(args)
    path = RESULTS / f"{args.name}_raw.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw = load_raw(path, settings)
    start, wall_before = time.perf_counter(), raw.get("wall_s", 0.0)
    with keep_core_busy() if args.busy_core else contextlib.nullcontext():
        plan_tasks(agent, tasks, raw, config, args, path)
        measure_rounds(tasks, raw, config, args.rounds, path, start, wall_before)
    names = settings["methods"]
    rows = [
        task_summary(agent, t, e, names, calibrated_agents(agent, t[1], args, args.seed + i))
        for i, (t, e) in enumerate(zip(tasks, raw["tasks"], strict=True))
    ]
    fams = family_rows(rows, names)
    # wall time and machine state from the runs that planned and measured (a re-run that
    # finds everything measured only re-reports)
    wall = raw.get("wall_s", time.perf_counter() - start)
    at_end = raw.get("machine", machine())
    note = at_end["note"]
    if args.busy_core:
        note += " Another process kept one core busy throughout (`--busy-core`)."
    text = report(fams, args, names, settings["checkpoint"], wall, note)
    data = {"settings": settings, "families": fams, "tasks": rows, "machine": at_end}
    write(args.name, data, text)


if __name__ == "__main__":
    main()
