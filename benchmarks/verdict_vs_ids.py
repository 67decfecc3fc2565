"""The verdict against the job's ids: how far the verification's measured ratio of the kept
plan to TorchRec's plan is from the same two plans measured on the task's own workload.

Every task of the generalisation roster (``--per-family`` test draws of each family; at
its own memory, and with ``--loose`` at loose memory too) is planned as a user plans it
(``harness.user_planning.plan_as_user``: ``dreamshard plan TASK`` with no flags, from an
empty cache of its own). Where its verification measured both the kept plan and TorchRec's
plan (the baseline candidate), the verification's ratio is their measured steps' ratio
(each the median over the verification's deciding rounds), on kernels fed ids the planner
made from each table's pooling factor and reuse histogram (and bag-length cv).

The same two placements of the same verified tables are then measured by the benchmarks'
harness (``harness.plan_measuring``: the task's own ``TableSpec`` s, ids drawn by
``torchrec_dreamshard.data.workloads.generate_batch`` at the harness's seeds and timing
protocol) in ``--rounds`` interleaved rounds; the harness's ratio is the median of the
per-round ratios of the slowest device's step (fused forward + backward + the modelled
all-to-all), as the verification times it; the compute-only ratio is kept too. The
difference per task (harness ratio less the verification's) and its largest and median
absolute value are the error a margin of a plan kept over TorchRec's must cover.

What differs between the two here: the ids' draws (seeds), the timing protocol and the
machine's noise at the two moments; both draw ids by the same generator from the same
statistics. A job whose ids follow another law than the declared histogram would add its
own error on top; measure that with the job's recorded batches where one has them.

Raw results ``results/NAME_raw.json`` (saved after every task planned and every round;
a rerun with the same settings resumes), summary ``NAME.md`` and ``NAME.json``.

Usage::

    python benchmarks/verdict_vs_ids.py                     # every family, 3 tasks each
    python benchmarks/verdict_vs_ids.py --loose --name verdict_vs_ids_loose
    python benchmarks/verdict_vs_ids.py --quick             # smoke: one task, one round
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from torchrec_dreamshard.data import families
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure import MeasureConfig
from torchrec_dreamshard.planner.adapters.task_inputs import table_fqn, task_inputs

from harness.plan_measuring import measure_rounds, plan_key
from harness.results_files import RESULTS, load_raw, machine, save_raw, write
from harness.task_draws import PER_FAMILY, roster
from harness.user_planning import fresh_cache, loose_task, plan_as_user, type_counts


def verified_task(task: Task, fqns: list[str]) -> Task:
    """``task``'s tables the verification measured (by fully qualified name, in its
    order), on ``task``'s devices."""
    by_fqn = {table_fqn(t.name): t for t in task.tables}
    return Task(
        tables=[by_fqn[f] for f in fqns],
        num_devices=task.num_devices,
        memory_bytes=list(task.memory),
        batch_size=task.batch_size,
        allow_oversized=True,
    )


def plan_entry(family: str, memory: str, task: Task) -> dict:
    """Plan ``task`` as a user (an empty cache) and keep what the verification measured."""
    with fresh_cache():
        user, _ = plan_as_user(task_inputs(task))
    verdict = user.verdict or {}
    entry = {
        "family": family,
        "memory": memory,
        "shape": [len(task.tables), task.num_devices],
        "plan_s": user.seconds,
        "types": type_counts(user.tables),
        "error": user.error,
        "verdict": verdict,
        "plans": {},
        "rounds": [],
    }
    if "ratio" in verdict and verdict.get("fqns"):
        entry["plans"] = {
            "kept": verdict["kept"]["placement"],
            "torchrec": verdict["torchrec"]["placement"],
        }
    else:
        notes = "; ".join(verdict.get("notes") or []) or user.error or "nothing measured"
        entry["why_not"] = notes
    return entry


def row(entry: dict) -> dict:
    """The two ratios of one task and their difference."""
    out = {k: entry[k] for k in ("family", "memory", "shape", "plan_s", "types")}
    out["verification"] = entry["verdict"].get("ratio")
    out["same_plan"] = bool(entry["plans"]) and (
        entry["plans"]["kept"] == entry["plans"]["torchrec"]
    )
    for metric in ("step", "compute"):
        out[f"harness_{metric}"] = None
        if entry["plans"] and entry["rounds"]:
            a, b = (plan_key(entry["plans"][n]) for n in ("kept", "torchrec"))
            ratios = [r[a][metric] / r[b][metric] for r in entry["rounds"] if a in r and b in r]
            out[f"harness_{metric}"] = statistics.median(ratios) if ratios else None
    v, h = out["verification"], out["harness_step"]
    out["difference"] = None if v is None or h is None else h - v
    out["why_not"] = entry.get("why_not")
    return out


def fmt(x: float | None, sign: bool = False) -> str:
    return "n/a" if x is None else (f"{x:+.3f}" if sign else f"{x:.3f}")


def report(rows: list[dict], settings: dict, note: str, command: str, quick: bool) -> str:
    lines = ["# The verdict against the task's own ids" + (" (SMOKE RUN)" if quick else ""), ""]
    if quick:
        lines += ["**A smoke run on a shared machine: not a result.**", ""]
    lines += [
        f"Families {', '.join(settings['families'])}, {settings['per_family']} task(s) each; "
        f"{settings['rounds']} harness round(s). Ratio: the kept plan's measured step over "
        "TorchRec's plan's (below 1: the kept plan is faster). Difference: the harness's "
        f"ratio less the verification's. {note} Produced by `{command}`.",
        "",
        "| family | memory | tables x devices | verification | harness (step) | harness "
        "(compute) | difference | kept TorchRec's plan | types |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        shape = f"{r['shape'][0]} x {r['shape'][1]}"
        if r["verification"] is None:
            lines.append(
                f"| {r['family']} | {r['memory']} | {shape} | not measured: "
                f"{(r['why_not'] or '')[:120]} | | | | | {r['types']} |"
            )
            continue
        lines.append(
            f"| {r['family']} | {r['memory']} | {shape} | {fmt(r['verification'])} | "
            f"{fmt(r['harness_step'])} | {fmt(r['harness_compute'])} | "
            f"{fmt(r['difference'], True)} | {'yes' if r['same_plan'] else ''} | {r['types']} |"
        )
    diffs = [abs(r["difference"]) for r in rows if r["difference"] is not None]
    apart = [
        abs(r["difference"]) for r in rows if r["difference"] is not None and not r["same_plan"]
    ]
    lines.append("")
    if diffs:
        lines.append(
            f"Absolute difference over {len(diffs)} tasks: largest {max(diffs):.3f}, median "
            f"{statistics.median(diffs):.3f}"
            + (
                f"; over the {len(apart)} where the kept plan is not TorchRec's: largest "
                f"{max(apart):.3f}, median {statistics.median(apart):.3f}."
                if apart
                else "; the kept plan was TorchRec's on every task."
            )
        )
    else:
        lines.append("No task had both plans measured by its verification.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="examples:\n  python benchmarks/verdict_vs_ids.py\n"
        "  python benchmarks/verdict_vs_ids.py --quick",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--families", nargs="*", default=list(families.FAMILIES))
    ap.add_argument("--per-family", type=int, default=PER_FAMILY)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--loose", action="store_true", help="also every task at loose memory")
    ap.add_argument("--quick", action="store_true", help="smoke: 1 family, 1 task, 1 round")
    ap.add_argument("--name", default=None, help="results stem (verdict_vs_ids[_quick])")
    args = ap.parse_args(argv)
    if args.quick:
        if args.families == list(families.FAMILIES):
            args.families = ["batch"]
        args.per_family, args.rounds = 1, 1
    name = args.name or ("verdict_vs_ids_quick" if args.quick else "verdict_vs_ids")
    settings = {k: getattr(args, k) for k in ("families", "per_family", "rounds", "seed", "loose")}
    drawn = roster(args.families, args.per_family, args.seed)
    memories = ("own", "loose") if args.loose else ("own",)
    cases = [(f, m, t if m == "own" else loose_task(t)) for f, t in drawn for m in memories]
    path: Path = RESULTS / f"{name}_raw.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw = load_raw(path, settings)
    start, wall_before = time.perf_counter(), raw.get("wall_s", 0.0)
    for i, (family, memory, task) in enumerate(cases):
        if i < len(raw["tasks"]):
            continue
        raw["tasks"].append(plan_entry(family, memory, task))
        save_raw(path, raw)
        print(f"planned {family} ({memory}): {raw['tasks'][-1]['plan_s']:.1f} s", flush=True)
    targets = []
    for (family, memory, task), entry in zip(cases, raw["tasks"], strict=True):
        fqns = entry["verdict"].get("fqns") if entry["plans"] else None
        targets.append((f"{family}/{memory}", verified_task(task, fqns) if fqns else task))
    measure_rounds(targets, raw, MeasureConfig(), args.rounds, path, start, wall_before)
    raw["machine"] = machine()
    save_raw(path, raw)
    rows = [row(e) for e in raw["tasks"]]
    text = report(
        rows, settings, raw["machine"]["note"], "python " + " ".join(sys.argv), args.quick
    )
    write(name, {"settings": settings, "rows": rows, "machine": raw["machine"]}, text)


if __name__ == "__main__":
    main()
