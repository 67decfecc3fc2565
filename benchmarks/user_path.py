"""The default as users run it: ``dreamshard plan TASK`` with no flags, on every task family,
at the family's memory and at loose memory, judged on real kernels and on real DMP steps.

Every task of the generalisation roster (``harness.task_draws.roster``: ``--per-family``
test draws of every family) is planned, once at the memory its family drew and once at
**loose memory** (each device ``LOOSE_FACTOR`` x an even share of the weights and at least
that times the biggest table: no placement is memory-bound, where the heuristics are at
their strongest), by:

- ``default``: ``DreamShardPlanner`` exactly as ``dreamshard plan TASK`` builds it with no
  flags (the command's own parser and ``task_planner``; ``get_default_sharders()``; every
  type TorchRec offers; TorchRec's storage contract, its default storage reservation then
  its storage estimate, on the task's memory), each task from an empty cache of its own
  (a fresh ``$XDG_CACHE_HOME``): a user's first plan on this machine, within the default
  budget;
- ``default_tw``: the same planner held to table-wise (``dreamshard plan --no-splits``),
  planned next from the cache the default left (the machine is then known to both alike);
- ``torchrec``: TorchRec's own plan (``EmbeddingShardingPlanner`` on the same inputs:
  every type, its default reservation), what a TorchRec user gets;
- the four heuristics (whole tables, weights against the task's memory), each marked by
  whether its plan fits the same storage contract (TorchRec's estimate of each table
  within what TorchRec's reservation leaves).

**Kernel judge.** Every plan that holds each table table-wise on one rank is measured on
the per-device fused kernels in interleaved rounds (``harness.plan_measuring``: each
table's ids drawn to its pooling factor, reuse and bag lengths by
``torchrec_dreamshard.data.workloads``), at the task's own device count. A figure is the
median over rounds of the per-round ratio of the slowest device's fused forward + backward.
A plan of other types (data-parallel, row-wise, column-wise, ...) is not measurable so: the
report names its types and leaves it to the DMP judge.

**DMP judge.** The first ``--step-tasks`` task(s) of each family, their tables on 2 gloo
ranks at the same total memory (and again at loose memory), planned afresh by the same
planners on the step timer's model, are trained under ``DistributedModelParallel`` in
alternating rounds (``torchrec_dreamshard.evaluation.dmp_step.time_plans``, as
``benchmarks/step_time.py``); reported with order-statistic intervals
(``evaluation.step_stats``): the default against TorchRec's plan, against the same planner
held to table-wise and against the best heuristic (the lowest median step) of those that
fit the contract. A model whose tables exceed ``--step-max-mib`` is not trained (each rank
holds every plan's shards).

Raw results: ``results/NAME_raw.json`` (saved after every task planned, every round
measured and every DMP case timed; a rerun with the same settings resumes), summary
``results/NAME.md`` and ``NAME.json``.

Usage::

    python benchmarks/user_path.py                       # the full run (about 3 hours)
    python benchmarks/user_path.py --busy-core --name user_path_busy
    python benchmarks/user_path.py --quick               # smoke: 1 family, 1 round
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
from pathlib import Path

from torchrec_dreamshard.data import families
from torchrec_dreamshard.data.families import HELDOUT_FAMILIES
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure import MeasureConfig
from torchrec_dreamshard.planner.adapters.task_inputs import task_inputs
from torchrec_dreamshard.policy.heuristics import HEURISTICS, proxy_greedy

from harness.busy_core import keep_core_busy
from harness.family_statistics import geomean
from harness.plan_measuring import measure_rounds, plan_key
from harness.results_files import RESULTS, load_note, load_raw, machine, save_raw, write
from harness.task_draws import PER_FAMILY, roster
from harness.user_planning import (
    LOOSE_FACTOR,
    fits_contract,
    fresh_cache,
    loose_task,
    placement_sharding_plan,
    plan_as_user,
    step_inputs,
    torchrec_own_plan,
    two_rank_task,
    type_counts,
    whole_placement,
)

MEMORIES = ("own", "loose")
PLANNERS = ("default", "default_tw", "torchrec")
WORLD = 2  # gloo ranks of the DMP judge


def at_memory(task: Task, memory: str) -> Task:
    return task if memory == "own" else loose_task(task)


# ----------------------------------------------------------------------------------------
# Planning
# ----------------------------------------------------------------------------------------


def plan_users(inputs, timeout: float | None = None) -> dict:
    """The default (fresh cache), the same held to table-wise (its cache) and TorchRec's
    own plan of ``inputs``: ``{name: UserPlan}``; ``timeout``: the planner's
    ``timeout_seconds`` (``None``: the default budget)."""
    with fresh_cache():
        default, _ = plan_as_user(inputs, timeout=timeout)
        tw, _ = plan_as_user(inputs, no_splits=True, timeout=timeout)
    return {"default": default, "default_tw": tw, "torchrec": torchrec_own_plan(inputs)}


def heuristic_plans(task: Task, inputs) -> tuple[dict, dict]:
    """Each heuristic's whole-table placement (``None``: none) and whether it fits the
    storage contract."""
    plans, fits = {}, {}
    for name, proxy in HEURISTICS.items():
        try:
            plans[name] = [int(d) for d in proxy_greedy(task, proxy)]
        except Exception as exc:  # noqa: BLE001 - a heuristic with no plan: recorded
            plans[name], fits[name] = None, f"no plan: {exc}"
            continue
        fits[name] = fits_contract(task, plans[name], inputs)
    return plans, fits


def plan_case(family: str, memory: str, task: Task, timeout: float | None = None) -> dict:
    """A kernel-judge entry: every plan (whole-table placements in ``plans``, what each
    user planner did in ``users``)."""
    inputs = task_inputs(task)
    users = plan_users(inputs, timeout)
    plans, fits = heuristic_plans(task, inputs)
    for name, up in users.items():
        plans[name] = whole_placement(task, up.tables) if up.plan is not None else None
    return {
        "family": family,
        "memory": memory,
        "shape": [len(task.tables), task.num_devices],
        "plans": plans,
        "fits": fits,
        "users": {n: {**u.record(), "types": type_counts(u.tables)} for n, u in users.items()},
        "rounds": [],
    }


def plan_cases(
    cases: list[tuple[str, str, Task]], raw: dict, path: Path, timeout: float | None = None
) -> None:
    for i, (family, memory, task) in enumerate(cases):
        if i < len(raw["tasks"]):
            continue
        raw["tasks"].append(plan_case(family, memory, task, timeout))
        save_raw(path, raw)
        users = raw["tasks"][-1]["users"]
        print(
            f"planned {family} ({memory} memory) T={len(task.tables)} D={task.num_devices}: "
            f"default {users['default']['seconds']:.1f} s {users['default']['types']}",
            flush=True,
        )


# ----------------------------------------------------------------------------------------
# The DMP judge
# ----------------------------------------------------------------------------------------


def step_case(family: str, memory: str, task: Task, args: argparse.Namespace) -> dict:
    """Plan ``task`` (2 ranks) with every planner on the step model and time the distinct
    plans on real DMP steps."""
    from torchrec_dreamshard.evaluation.dmp_step import (
        StepTimerConfig,
        table_shardings,
        time_plans,
    )
    from torchrec_dreamshard.evaluation.step_model import StepModelSpec

    entry: dict = {"family": family, "memory": memory, "shape": [len(task.tables), WORLD]}
    mib = sum(t.size_bytes for t in task.tables) / 2**20
    entry["mib"] = mib
    if mib > args.step_max_mib:
        entry["skipped"] = f"{mib:.0f} MiB of tables, over --step-max-mib {args.step_max_mib:g}"
        return entry
    inputs = step_inputs(task)
    users = plan_users(inputs)
    sharding = {n: u.plan for n, u in users.items() if u.plan is not None}
    entry["users"] = {n: {**u.record(), "types": type_counts(u.tables)} for n, u in users.items()}
    names = [t.name for t in task.tables]
    heur, fits = heuristic_plans(task, task_inputs(task))
    entry["fits"] = fits
    seen = {plan_key(u.tables) for u in users.values() if u.plan is not None}
    for name, placement in heur.items():
        if placement is None or fits[name] is not True:
            continue
        plan = placement_sharding_plan(inputs.model, names, placement, WORLD)
        key = plan_key(table_shardings(plan))
        if key in seen:  # a plan another planner made: timed once, under its name
            entry.setdefault("same_as_earlier", []).append(name)
            continue
        seen.add(key)
        sharding[name] = plan
    spec = StepModelSpec(bags=tuple(task.tables))
    config = StepTimerConfig(
        batch_size=inputs.batch_size,
        rounds=args.step_rounds,
        warmup_steps=args.step_warmup,
        steps=args.step_steps,
    )
    times = time_plans(spec, sharding, WORLD, config)
    entry["rounds"] = times.rounds
    entry["timed"] = sorted(sharding)
    return entry


def step_cases(tasks, raw: dict, path: Path, args: argparse.Namespace) -> None:
    done = {(e["family"], e["memory"], tuple(e["shape"])) for e in raw["steps"]}
    for family, memory, task in tasks:
        if (family, memory, (len(task.tables), WORLD)) in done:
            continue
        start = time.perf_counter()
        try:
            entry = step_case(family, memory, task, args)
        except Exception as exc:  # recorded and reported; the other cases still run
            entry = {"family": family, "memory": memory, "shape": [len(task.tables), WORLD]}
            entry["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        entry["wall_s"] = time.perf_counter() - start
        raw["steps"].append(entry)
        save_raw(path, raw)
        print(f"DMP judge {family} ({memory}): {entry['wall_s']:.0f} s", flush=True)


# ----------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------


def fmt(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.3f}"


def kernel_row(entry: dict) -> dict:
    """One kernel-judge case's ratios (compute and step) of the default's plan to the best
    fitting heuristic's, TorchRec's and the table-wise planner's, where measurable."""
    rounds = entry["rounds"]

    def costs(name: str, metric: str) -> list[float] | None:
        plan = entry["plans"].get(name)
        if plan is None or not rounds:
            return None
        key = plan_key(plan)
        return [r[key][metric] for r in rounds if key in r]

    fitting = [h for h in HEURISTICS if entry["fits"].get(h) is True and costs(h, "compute")]
    best = min(fitting, key=lambda h: statistics.median(costs(h, "compute")), default=None)
    row = {"family": entry["family"], "memory": entry["memory"], "best_fitting": best}
    for metric in ("compute", "step"):
        mine = costs("default", metric)
        for other in (best, "torchrec", "default_tw"):
            label = f"vs_{'best' if other == best else other}_{metric}"
            theirs = costs(other, metric) if other else None
            ratios = [a / b for a, b in zip(mine or [], theirs or [], strict=False) if a and b]
            row[label] = statistics.median(ratios) if mine and theirs and ratios else None
    users = entry["users"]
    row["types"] = {n: users[n]["types"] or users[n]["error"] for n in PLANNERS}
    row["plan_s"] = users["default"]["seconds"]
    row["spent_s"] = (users["default"]["adaptation"] or {}).get("spent_s")
    margins = (users["default"]["adaptation"] or {}).get("margins") or {}
    row["kept"] = margins.get("line") or "; ".join(
        (users["default"]["verdict"] or {}).get("notes") or []
    )
    return row


def type_cell(types) -> str:
    if isinstance(types, str):
        return f"no plan ({types[:60]})"
    return ", ".join(f"{k} {v}" for k, v in types.items())


def kernel_lines(rows: list[dict]) -> list[str]:
    lines = [
        "## Kernel judge (per-device fused kernels, the task's own device count)",
        "",
        "Per task, the median over rounds of the per-round ratio of measured compute (the "
        "slowest device's fused forward + backward). n/a: a plan is missing, or holds a table "
        "otherwise than table-wise on one rank (its types are given; the DMP judge below "
        "times such plans). Below 1: the default is faster.",
        "",
        "| family | held out | memory | default / best fitting heuristic | default / TorchRec "
        "| default / default_tw | default's types | TorchRec's types | plan s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        held = "yes" if r["family"] in HELDOUT_FAMILIES else ""
        lines.append(
            f"| {r['family']} | {held} | {r['memory']} | {fmt(r['vs_best_compute'])} "
            f"({r['best_fitting'] or 'none fits'}) | {fmt(r['vs_torchrec_compute'])} | "
            f"{fmt(r['vs_default_tw_compute'])} | {type_cell(r['types']['default'])} | "
            f"{type_cell(r['types']['torchrec'])} | {r['plan_s']:.1f} |"
        )
    lines += [
        "",
        "| memory | families | geomean vs best fitting [tasks measured] | vs TorchRec "
        "| vs default_tw |",
    ]
    lines.append("|---|---|---|---|---|")
    for memory in MEMORIES:
        for label, keep in (
            ("all", lambda r: True),
            ("held out", lambda r: r["family"] in HELDOUT_FAMILIES),
            ("others", lambda r: r["family"] not in HELDOUT_FAMILIES),
        ):
            sel = [r for r in rows if r["memory"] == memory and keep(r)]
            if not sel:
                continue
            cells = [  # each geomean with the tasks it stands on (n/a ones left out)
                f"{fmt(geomean(r[k] for r in sel))} [{sum(1 for r in sel if r[k])}]"
                for k in ("vs_best_compute", "vs_torchrec_compute", "vs_default_tw_compute")
            ]
            lines.append(f"| {memory} | {label} ({len(sel)} tasks) | {' | '.join(cells)} |")
    timed = [r for r in rows if r["plan_s"] is not None]
    if timed:
        from torchrec_dreamshard.planner.steps.profile_step import FIRST_PLAN_BUDGET_S

        worst = max(timed, key=lambda r: r["plan_s"])
        over = sum(r["plan_s"] > FIRST_PLAN_BUDGET_S for r in timed)
        lines += [
            "",
            f"Default first plans against the default budget ({FIRST_PLAN_BUDGET_S:g} s, wall "
            f"time of `plan()`): longest {worst['plan_s']:.1f} s ({worst['family']}, "
            f"{worst['memory']} memory); {over} of {len(timed)} over.",
        ]
    lines += ["", "What each default first plan said it kept:", ""]
    lines += [f"- {r['family']} ({r['memory']}): {r['kept'] or '-'}" for r in rows]
    return lines


def step_lines(entries: list[dict]) -> list[str]:
    from torchrec_dreamshard.evaluation.step_stats import median_interval, ratio_interval, verdict

    lines = [
        "",
        f"## DMP judge (real training steps on {WORLD} gloo ranks, alternating rounds)",
        "",
    ]
    for e in entries:
        head = f"### {e['family']} ({e['memory']} memory), {e['shape'][0]} tables on {WORLD} ranks"
        if "skipped" in e or "error" in e:
            lines += [head, "", f"not timed: {e.get('skipped') or e.get('error')}", ""]
            continue
        rounds, users = e["rounds"], e["users"]
        ms = {p: [r["step_ms"][p] for r in rounds] for p in e["timed"]}
        lines += [head, "", "| plan | median step ms [interval] | types |", "|---|---|---|"]
        for p in e["timed"]:
            m = median_interval(ms[p])
            types = type_cell(users[p]["types"]) if p in users else "table_wise (whole tables)"
            lines.append(f"| {p} | {m.median:.2f} [{m.low:.2f}, {m.high:.2f}] | {types} |")
        for p in PLANNERS:
            if p not in e["timed"]:
                lines.append(f"| {p} | not timed | {type_cell(users[p]['types'])} |")
        heur = [p for p in e["timed"] if p in HEURISTICS]
        best = min(heur, key=lambda p: statistics.median(ms[p]), default=None)
        lines += ["", "| ratio | median [interval] | verdict |", "|---|---|---|"]
        for other in ("torchrec", "default_tw", best):
            if other and "default" in ms and other in ms:
                r = ratio_interval(ms["default"], ms[other])
                cells = (
                    f"{r.median:.3f} [{r.low:.3f}, {r.high:.3f}] | {verdict(r, 'default', other)}"
                )
                lines.append(f"| default / {other} | {cells} |")
        lines.append("")
    return lines


def rounds_measured(raw: dict) -> int:
    """The kernel rounds every task has (a run stopped early has fewer than it asked)."""
    return min((len(e["rounds"]) for e in raw["tasks"]), default=0)


def report(raw: dict, rows: list[dict], quick: bool, command: str) -> str:
    s = raw["settings"]
    head = [
        "# The default as users run it: `dreamshard plan TASK`, no flags"
        + (" (SMOKE RUN)" if quick else ""),
        "",
    ]
    if quick:
        head += [
            "**A smoke run: one task, one round, on a shared machine. These numbers are not a "
            "result.**",
            "",
        ]
    head += [
        f"Families {', '.join(s['families'])}, {s['per_family']} task(s) each, at their own "
        f"memory and at loose memory ({LOOSE_FACTOR:g}x an even share of the weights); "
        f"{rounds_measured(raw)} of {s['rounds']} kernel round(s) measured; "
        f"DMP judge: {s['step_rounds']} round(s) of "
        f"{s['step_warmup']} warm-up and {s['step_steps']} timed steps. Each default plan from "
        "an empty cache of its own"
        + (f", within `--timeout {s['timeout']:g}`" if s.get("timeout") else "")
        + ". Produced by `"
        + command
        + "`. "
        + raw.get("machine", {}).get("note", load_note()),
        "",
    ]
    return "\n".join(head + kernel_lines(rows) + step_lines(raw["steps"]))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="examples:\n  python benchmarks/user_path.py\n"
        "  python benchmarks/user_path.py --busy-core --name user_path_busy\n"
        "  python benchmarks/user_path.py --quick          # smoke run, ~5 minutes",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--families", nargs="*", default=list(families.FAMILIES))
    ap.add_argument("--per-family", type=int, default=PER_FAMILY)
    ap.add_argument("--memories", nargs="*", default=list(MEMORIES), choices=MEMORIES)
    ap.add_argument("--rounds", type=int, default=3, help="kernel-judge rounds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-tasks", type=int, default=1, help="DMP-judged tasks per family")
    ap.add_argument("--step-rounds", type=int, default=10)
    ap.add_argument("--step-steps", type=int, default=10, help="timed DMP steps per round")
    ap.add_argument("--step-warmup", type=int, default=3)
    ap.add_argument("--step-max-mib", type=float, default=1024.0, help="largest DMP model")
    ap.add_argument("--no-steps", action="store_true", help="skip the DMP judge")
    ap.add_argument("--busy-core", action="store_true", help="another process spins on a core")
    ap.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="dreamshard plan --timeout (the plan's budget, s; default: the planner's)",
    )
    ap.add_argument("--quick", action="store_true", help="smoke: 1 family, 1 task, 1 round")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="plan and measure nothing more: write the report from the rounds measured",
    )
    ap.add_argument("--name", default=None, help="results stem (user_path, user_path_quick)")
    args = ap.parse_args(argv)
    if args.quick:
        if args.families == list(families.FAMILIES):
            args.families = ["bursty"]
        args.per_family, args.rounds, args.memories = 1, 1, ["own"]
        args.step_rounds, args.step_steps, args.step_warmup = 2, 2, 1
    args.name = args.name or ("user_path_quick" if args.quick else "user_path")
    return args


def run_command() -> str:
    """The command line that started this run, the script named from the repository root."""
    script = Path(sys.argv[0]).resolve()
    with contextlib.suppress(ValueError):
        script = script.relative_to(Path(__file__).resolve().parents[1])
    return " ".join(["python", str(script), *sys.argv[1:]])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    settings = {
        k: getattr(args, k)
        for k in (
            "families",
            "per_family",
            "memories",
            "rounds",
            "seed",
            "step_tasks",
            "step_rounds",
            "step_steps",
            "step_warmup",
            "step_max_mib",
            "no_steps",
            "busy_core",
        )
    }
    if args.timeout is not None:  # a run at the default budget keeps its settings as before
        settings["timeout"] = args.timeout
    drawn = roster(args.families, args.per_family, args.seed)
    cases = [(f, m, at_memory(t, m)) for f, t in drawn for m in args.memories]
    firsts = [(f, t) for k, (f, t) in enumerate(drawn) if k % args.per_family < args.step_tasks]
    steps = [(f, m, at_memory(two_rank_task(t), m)) for f, t in firsts for m in args.memories]
    path = RESULTS / f"{args.name}_raw.json"
    if args.report_only:  # the run's own settings and machine, whatever flags came now
        if not path.exists():
            raise SystemExit(f"--report-only: {path} does not exist; nothing was measured")
        raw = json.loads(path.read_text())
        write_report(args, raw["settings"], raw)
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw = load_raw(path, settings)
    raw.setdefault("steps", [])
    raw.setdefault("command", run_command())
    raw["quick"] = args.quick
    start, wall_before = time.perf_counter(), raw.get("wall_s", 0.0)
    with keep_core_busy() if args.busy_core else contextlib.nullcontext():
        plan_cases(cases, raw, path, args.timeout)
        named = [(f"{f}/{m}", t) for f, m, t in cases]
        measure_rounds(named, raw, MeasureConfig(), args.rounds, path, start, wall_before)
        if not args.no_steps:
            step_cases(steps, raw, path, args)
    raw["machine"] = machine()
    save_raw(path, raw)
    write_report(args, settings, raw)


def write_report(args: argparse.Namespace, settings: dict, raw: dict) -> None:
    """The report of ``raw`` under ``args.name``: the command and smoke flag are the ones the
    run was started with (saved in ``raw``), so ``--report-only`` rewrites it unchanged."""
    raw.setdefault("machine", machine())
    rows = [kernel_row(e) for e in raw["tasks"]]
    text = report(raw, rows, raw.get("quick", args.quick), raw.get("command", run_command()))
    write(args.name, {"settings": settings, "rows": rows, "machine": raw["machine"]}, text)


if __name__ == "__main__":
    main()
