"""The default planner's plan against TorchRec's and the best heuristic's, per family, from
a generalisation run with ``--default`` (its raw file): the figures the "never slower than
TorchRec's planner" question asks for.

Per task, each figure is the median over rounds of the per-round ratio of measured compute
(max over devices of fused forward + backward) of the default planner's plan to TorchRec's
planner's plan (``torchrec``: TorchRec's ``EmbeddingShardingPlanner`` as shipped, default
storage reservation; where it finds no plan the task has no figure) and to the per-task best
heuristic's (the lowest median of the four), and to the best heuristic's whose plan fits
TorchRec's storage estimate (the heuristics count weights only; the default planner counts
TorchRec's estimate of weights, optimizer state and buffers, and a plan over it is one
TorchRec's partitioner would refuse). Also: what the default's verification kept and
said (or why it found no plan, or did not verify), its interval of per-round ratios against
TorchRec's, and each first plan's seconds against the default budget
(``FIRST_PLAN_BUDGET_S``): the longest, and the tasks over it.

With ``--against METHOD`` (a method of the run, e.g. ``calibrated_20_verify4``: the
calibrated agent's verified plan, counting weights only, what last round's default was),
the default is also set against that method's plan in the same rounds, with whether that
plan fits TorchRec's storage estimate: the like-for-like comparison with an earlier default
is over the tasks where it does.

Usage: python benchmarks/default_vs_torchrec.py generalisation_r32 [--metric step]
       [--against METHOD]
       (reads results/NAME_raw.json, writes results/NAME_vs_torchrec.md and .json;
       by step, NAME_vs_torchrec_step.md and .json)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

from torchrec_dreamshard.data.families import HELDOUT_FAMILIES
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.planner.steps.profile_step import FIRST_PLAN_BUDGET_S

from harness.default_planning import (
    fits_torchrec_storage,
    torchrec_table_storage,
)
from harness.results_files import RESULTS, write
from harness.task_draws import roster

HEURISTICS = ("size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy")


def task_row(task: dict, metric: str, drawn: Task, against: str | None = None) -> dict:
    """One task's ratios (``None`` where a plan is missing) and the default's adaptation;
    ``drawn``: the task itself (for TorchRec's storage estimate of its tables); with
    ``against``, the ratio to that method's plan and whether that plan fits the estimate."""
    rounds = task["rounds"]

    def cost(name: str, rnd: dict) -> float | None:
        plan = task["plans"].get(name)
        found = None if plan is None else rnd.get(json.dumps(plan))
        return None if found is None else found[metric]

    def ratios(other: str) -> list[float]:
        pairs = [(cost("default", r), cost(other, r)) for r in rounds]
        return [a / b for a, b in pairs if a and b]

    medians = {
        h: statistics.median(c) if (c := [x for r in rounds if (x := cost(h, r))]) else math.inf
        for h in HEURISTICS
    }
    best = min(medians, key=medians.get)
    vs_best, vs_torchrec = ratios(best), ratios("torchrec")
    storage = torchrec_table_storage(drawn)
    fitting = {
        h: m
        for h, m in medians.items()
        if task["plans"].get(h) and fits_torchrec_storage(drawn, task["plans"][h], storage)
    }
    vs_fitting = ratios(min(fitting, key=fitting.get)) if fitting else []
    vs_against = ratios(against) if against else []
    against_plan = task["plans"].get(against) if against else None
    secs = task["secs"]
    adaptation = secs.get("default_adaptation") or {}
    plan_s = secs.get("default")
    budget = secs.get("default_budget_s", FIRST_PLAN_BUDGET_S)
    return {
        "family": task["family"],
        "rounds": len(rounds),
        "vs_best_heuristic": statistics.median(vs_best) if vs_best else None,
        "vs_best_fitting_heuristic": statistics.median(vs_fitting) if vs_fitting else None,
        "vs_torchrec": statistics.median(vs_torchrec) if vs_torchrec else None,
        "vs_torchrec_range": [min(vs_torchrec), max(vs_torchrec)] if vs_torchrec else None,
        "vs_against": statistics.median(vs_against) if vs_against else None,
        "vs_against_range": [min(vs_against), max(vs_against)] if vs_against else None,
        "against_fits": None
        if against_plan is None
        else fits_torchrec_storage(drawn, against_plan, storage),
        "kept": kept_line(secs, adaptation),
        "spent_s": adaptation.get("spent_s"),
        "plan_s": plan_s,
        "budget_s": budget,
        "within_budget": None if plan_s is None else plan_s <= budget,
    }


def kept_line(secs: dict, adaptation: dict) -> str:
    """What the default's plan said it bought: the verification's line; else why it found
    no plan, or what it did not measure (its measuring notes) and why it did not verify."""
    line = (adaptation.get("margins") or {}).get("line")
    if line:
        return line
    if secs.get("default_error"):
        return f"no plan: {secs['default_error']}"
    notes = "; ".join(adaptation.get("measuring_notes") or [])
    why = adaptation.get("why") or "no reason recorded"
    return f"not verified ({why})" + (f"; {notes}" if notes else "")


def geomean(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def fmt(x: float | None) -> str:
    """A ratio to three places, ``n/a`` where there is none."""
    return "n/a" if x is None else f"{x:.3f}"


def with_range(x: float | None, rng: list[float] | None) -> str:
    """A ratio with its ``[min, max]`` over rounds, where there is one."""
    return fmt(x) + (f" [{rng[0]:.3f}, {rng[1]:.3f}]" if rng else "")


def held_out(row: dict) -> str:
    """``yes`` where the row's family is held out of training."""
    return "yes" if row["family"] in HELDOUT_FAMILIES else ""


def summary(name: str, rows: list[dict], metric: str) -> str:
    lines = [
        f"# The default planner against TorchRec's and the best heuristic ({name})",
        "",
        f"From `{name}_raw.json` ({metric}; per task the median over rounds of the per-round "
        "ratio; [min, max] over rounds). TorchRec: its planner as shipped; n/a where it found "
        "no plan. Below 1: the default is faster.",
        "",
        "| family | held out | default / best heuristic | default / best heuristic within "
        "TorchRec's storage estimate | default / TorchRec [range] | rounds | plan s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tr = with_range(r["vs_torchrec"], r["vs_torchrec_range"])
        held = held_out(r)
        plan_s = "n/a" if r["plan_s"] is None else f"{r['plan_s']:.1f}"
        lines.append(
            f"| {r['family']} | {held} | {fmt(r['vs_best_heuristic'])} "
            f"| {fmt(r['vs_best_fitting_heuristic'])} | {tr} | {r['rounds']} | {plan_s} |"
        )
    held = [r for r in rows if r["family"] in HELDOUT_FAMILIES]
    rest = [r for r in rows if r["family"] not in HELDOUT_FAMILIES]
    lines += [
        "",
        "Geomean default / best heuristic: all "
        f"{fmt(geomean([r['vs_best_heuristic'] for r in rows]))}, held out "
        f"{fmt(geomean([r['vs_best_heuristic'] for r in held]))}, others "
        f"{fmt(geomean([r['vs_best_heuristic'] for r in rest]))}. Within TorchRec's storage "
        f"estimate: all {fmt(geomean([r['vs_best_fitting_heuristic'] for r in rows]))}, held "
        f"out {fmt(geomean([r['vs_best_fitting_heuristic'] for r in held]))}. "
        "Geomean default / TorchRec "
        f"where TorchRec planned: {fmt(geomean([r['vs_torchrec'] for r in rows]))}.",
        "",
        budget_line(rows),
        "",
        "What the default's first plan said it bought, per task:",
        "",
    ]
    lines += [f"- {r['family']}: {r['kept']}" for r in rows]
    return "\n".join(lines)


def against_lines(rows: list[dict], against: str) -> list[str]:
    """The default against ``against``'s plan per task, and the geomeans over every task
    and over those where that plan fits TorchRec's storage estimate (like for like)."""
    lines = [
        f"The default against `{against}` in the same rounds (below 1: the default is faster):",
        "",
        f"| family | held out | default / {against} [range] | {against}'s plan fits "
        "TorchRec's storage estimate |",
        "|---|---|---|---|",
    ]
    for r in rows:
        ratio = with_range(r["vs_against"], r["vs_against_range"])
        fits = {None: "no plan", True: "yes", False: "no"}[r["against_fits"]]
        held = held_out(r)
        lines.append(f"| {r['family']} | {held} | {ratio} | {fits} |")
    like = [r for r in rows if r["against_fits"]]
    lines += [
        "",
        f"Geomean default / {against}: every task "
        f"{fmt(geomean([r['vs_against'] for r in rows]))}; where its plan fits TorchRec's "
        f"estimate ({len(like)} tasks) {fmt(geomean([r['vs_against'] for r in like]))}.",
    ]
    return lines


def budget_line(rows: list[dict]) -> str:
    """Each first plan's seconds against the default budget: the longest, and the tasks
    over the budget."""
    timed = [r for r in rows if r["plan_s"] is not None]
    if not timed:
        return "No default plan seconds recorded."
    worst = max(timed, key=lambda r: r["plan_s"])
    over = [f"{r['family']} ({r['plan_s']:.1f} s)" for r in timed if not r["within_budget"]]
    return (
        f"Each first plan against the default budget ({worst['budget_s']:g} s, measuring "
        f"included): the longest took {worst['plan_s']:.1f} s ({worst['family']}); over the "
        f"budget: {', '.join(over) if over else 'none'} ({len(over)} of {len(timed)} tasks)."
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="the generalisation run's results stem")
    ap.add_argument("--metric", choices=("compute", "step"), default="compute")
    ap.add_argument("--against", default=None, metavar="METHOD", help="also against this method")
    args = ap.parse_args(argv)
    raw = json.loads((RESULTS / f"{args.name}_raw.json").read_text())
    settings = raw["settings"]
    drawn = roster(settings["families"], settings["per_family"], settings["seed"])
    rows = [
        task_row(t, args.metric, task, args.against)
        for t, (_, task) in zip(raw["tasks"], drawn, strict=True)
        if t["rounds"]
    ]
    stem = f"{args.name}_vs_torchrec" + ("_step" if args.metric == "step" else "")
    text = summary(args.name, rows, args.metric)
    if args.against:
        text += "\n\n" + "\n".join(against_lines(rows, args.against))
    write(stem, {"rows": rows, "against": args.against}, text)


if __name__ == "__main__":
    main()
