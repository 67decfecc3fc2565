"""End to end: planners judged by the DMP training step on gloo ranks (issue 18).

Every family's model is planned by three planners, each with TorchRec's
``get_default_sharders()``:

- **torchrec**: TorchRec's ``EmbeddingShardingPlanner`` (every sharding type);
- **dreamshard**: ``DreamShardPlanner`` with every sharding type its constraints allow;
- **dreamshard-tw**: ``DreamShardPlanner`` with table-wise-only constraints;
- **dreamshard-cal**: ``DreamShardPlanner(calibrate=True)``: the bundled cost network
  calibrated on this machine's kernels first (what a user on hardware other than the
  checkpoint's does), every sharding type allowed.

Each plan's model (:class:`torchrec_dreamshard.evaluation.step_model.StepDLRM`: dense MLP,
the bag and sequence tables, over-arch; fused row-wise Adagrad on the embeddings) is
trained under ``DistributedModelParallel`` and ``TrainPipelineSparseDist`` on 2 gloo CPU
ranks, one thread each (:func:`torchrec_dreamshard.evaluation.dmp_step.time_plans`). In each
round every plan runs warm-up steps then timed steps, in an order that changes from round
to round; a round's figure is the mean timed step, the maximum over ranks. Reported per
family: each plan's median step with its interval over rounds, the per-round ratios
dreamshard / torchrec, dreamshard-tw / torchrec, dreamshard / dreamshard-tw and
dreamshard-cal / torchrec with their intervals (order statistics,
:mod:`torchrec_dreamshard.evaluation.step_stats`), and the sharding types each plan used.
A difference is called only when its interval excludes 1.

Families (per-rank batch 512 by default; ids drawn to each table's pooling factor and
Zipf-skewed reuse by :mod:`torchrec_dreamshard.data.workloads`):

- **tiny**: 100 small tables (20-2000 rows, dims 8-16, 1-4 ids per sample);
- **huge_hot**: 3 big tables (1M, 600k, 400k rows, dim 64, 20-50 ids, Zipf 1.0-1.2) and 4
  small ones;
- **wide**: 8 tables of dim 256 or 512 (5k-40k rows);
- **sequence**: 6 sequence tables (``EmbeddingCollection``, dim 32, 10-30 ids) and 10 bags;
- **mixed**: 80 tiny, 2 huge hot and 8 medium tables.

Raw results go to ``results/step_time_raw.json`` after every family, and each finished
round is appended to ``results/step_time_raw.<family>.jsonl`` as it ends, so an interrupted
run keeps its rounds: a re-run continues where it stopped (when a family's plans and
settings are unchanged; otherwise that family starts afresh). ``--quick`` is a smoke run
(2 rounds, short steps, two families) written to ``step_time_quick*``.

Usage: python benchmarks/step_time.py [--rounds 10] [--families tiny,mixed] [--quick]
    [--name STEM]   # results/STEM.md and STEM_raw.json: keep another machine's run apart
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import warnings
from pathlib import Path

from torchrec_dreamshard.cli.steptime import prepare_machine_models
from torchrec_dreamshard.evaluation.step_model import StepModelSpec

from harness.results_files import RESULTS, load_note, machine
from harness.step_families import FAMILIES, WORLD, family_spec

PLANNERS = ("torchrec", "dreamshard", "dreamshard-tw", "dreamshard-cal")
RATIOS = (
    ("dreamshard", "torchrec"),
    ("dreamshard-tw", "torchrec"),
    ("dreamshard", "dreamshard-tw"),
    ("dreamshard-cal", "torchrec"),
)
QUICK_FAMILIES = ("tiny", "sequence")
SMOKE_NOTE = (
    "**A smoke run, under load on a shared machine, with too few rounds for any interval "
    "to reach 95%: these numbers are not a result.**\n"
)


def describe(spec: StepModelSpec) -> dict:
    return {
        "bag_tables": len(spec.bags),
        "sequence_tables": len(spec.sequences),
        "mib": sum(t.size_bytes for t in spec.tables) / 2**20,
        "tables": [t.to_dict() for t in spec.tables],
    }


# ----------------------------------------------------------------------------------------
# Planning and timing
# ----------------------------------------------------------------------------------------


def plan_family(spec: StepModelSpec, batch: int) -> tuple[dict, dict]:
    """Every planner's plan (by name) and its summary, or the error it raised."""
    from torchrec_dreamshard.cli.steptime import NamedPlanner
    from torchrec_dreamshard.evaluation.dmp_step import make_plan, table_shardings

    plans, summaries = {}, {}
    for name in PLANNERS:
        start = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                plans[name] = make_plan(spec, NamedPlanner(name), WORLD, batch)
        except Exception as exc:  # recorded and reported; the other planners still run
            summaries[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"  {name}: planning failed: {exc}", flush=True)
            continue
        summaries[name] = {
            "tables": table_shardings(plans[name]),
            "planning_s": time.perf_counter() - start,
        }
    return plans, summaries


def same_plans(a: dict, b: dict) -> bool:
    """Whether two families' plan summaries place every table alike (timing aside)."""
    strip = lambda s: {k: v.get("tables", v.get("error")) for k, v in s.items()}  # noqa: E731
    return strip(a) == strip(b)


def read_round_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rounds = []
    for line in path.read_text().splitlines():
        try:
            rounds.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by an interruption: that round is lost
            break
    return rounds


def run_family(name: str, raw: dict, settings: dict, raw_path: Path) -> None:
    """Plan ``name``, take over finished rounds when nothing changed (settings, plans and
    the CPU model: rounds from another machine are never mixed in), time the rest."""
    from torchrec_dreamshard.evaluation.dmp_step import StepTimerConfig, time_plans

    spec = family_spec(name, settings["batch_size"])
    plans, summaries = plan_family(spec, settings["batch_size"])
    log = raw_path.with_name(f"{raw_path.stem}.{name}.jsonl")
    old = raw["families"].get(name)
    kept = []
    cpu = raw["machine"]["device_name"]
    same = old and old["settings"] == settings and old.get("cpu") == cpu
    if same and same_plans(old["plans"], summaries):
        kept = old["rounds"] + read_round_log(log)
    elif old or log.exists():
        print(f"{name}: plans, settings or CPU changed; earlier rounds are dropped", flush=True)
    log.unlink(missing_ok=True)
    entry = {
        "settings": settings,
        "cpu": cpu,
        "model": describe(spec),
        "plans": summaries,
        "rounds": kept,
    }
    raw["families"][name] = entry
    todo = settings["rounds"] - len(kept)
    print(f"{name}: {len(kept)} rounds kept, {max(todo, 0)} to run", flush=True)
    if todo <= 0 or not plans:
        return
    config = StepTimerConfig(
        batch_size=settings["batch_size"],
        rounds=todo,
        warmup_steps=settings["warmup"],
        steps=settings["steps"],
        first_round=len(kept),
    )
    try:
        times = time_plans(spec, plans, WORLD, config, round_log=log)
        entry["rounds"] = kept + times.rounds
        for plan, info in times.plans.items():
            summaries[plan]["pipelined"] = info["pipelined"]
    finally:
        if len(entry["rounds"]) == len(kept):  # interrupted: what the log holds
            entry["rounds"] = kept + read_round_log(log)
        raw_path.write_text(json.dumps(raw, indent=1) + "\n")
        log.unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------


def family_lines(name: str, entry: dict) -> list[str]:
    """The family's Markdown: each plan's median step, then the ratios."""
    from torchrec_dreamshard.evaluation.dmp_step import sharding_type_counts
    from torchrec_dreamshard.evaluation.step_stats import median_interval, ratio_interval, verdict

    model, rounds, plans = entry["model"], entry["rounds"], entry["plans"]
    lines = [
        f"### {name}: {model['bag_tables']} bag tables, {model['sequence_tables']} sequence "
        f"tables, {model['mib']:.0f} MiB; {len(rounds)} rounds on {entry['cpu']}",
        "",
        "| planner | median step ms [interval] | sharding types | planning s |",
        "|---|---|---|---|",
    ]
    ms = {p: [r["step_ms"][p] for r in rounds] for p in plans if "error" not in plans[p]}
    for p, info in plans.items():
        if "error" in info:
            lines.append(f"| {p} | planning failed: {info['error']} | | |")
            continue
        counts = ", ".join(f"{k} {v}" for k, v in sharding_type_counts(info["tables"]).items())
        step = "-"
        if rounds:
            m = median_interval(ms[p])
            step = f"{m.median:.2f} [{m.low:.2f}, {m.high:.2f}]"
        lines.append(f"| {p} | {step} | {counts} | {info['planning_s']:.2f} |")
    lines += ["", "| ratio | median [interval] | verdict |", "|---|---|---|"]
    for a, b in RATIOS:
        if a in ms and b in ms and rounds:
            r = ratio_interval(ms[a], ms[b])
            same = (
                " (identical plans: a check of the noise)"
                if plans[a]["tables"] == plans[b]["tables"]
                else ""
            )
            cells = f"{r.median:.3f} [{r.low:.3f}, {r.high:.3f}] | {verdict(r, a, b)}{same}"
            lines.append(f"| {a} / {b} | {cells} |")
    if rounds:
        coverage = median_interval(next(iter(ms.values()))).coverage
        lines.append(f"\nIntervals hold the median with probability {coverage:.1%}.")
    return lines + [""]


def report(raw: dict, quick: bool, command: str = "python benchmarks/step_time.py") -> str:
    s = raw["settings"]
    head = [
        "# End-to-end step time: planners on real DMP training steps",
        "",
        f"{WORLD} gloo CPU ranks, one thread each; per-rank batch {s['batch_size']}; each "
        f"round runs every plan for {s['warmup']} warm-up and {s['steps']} timed steps, in an "
        "order that changes every round; a figure is the mean timed step, max over ranks. "
        "Medians over rounds with order-statistic intervals; ratios are per round (a / b in "
        "the same round). A difference is called only when its interval excludes 1.",
        "",
        f"Produced by `{command}`; each "
        "family names the CPU model it was timed on (a re-run on another CPU model times "
        "the family afresh). "
        + raw["machine"].get("note", load_note())
        + f" The benchmark's own {WORLD} ranks keep {WORLD} cores busy: that load counts them.",
        "",
    ]
    if quick:
        head[0] += " (SMOKE RUN)"
        head.insert(2, SMOKE_NOTE)
    body = [line for name, e in raw["families"].items() for line in family_lines(name, e)]
    return "\n".join(head + body)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per plan per round")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up steps per plan per round")
    ap.add_argument("--batch-size", type=int, default=512, help="samples per rank per step")
    ap.add_argument("--families", help=f"comma-separated, of {','.join(FAMILIES)}")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 rounds, 2 families")
    ap.add_argument(
        "--name", help="results file stem (default step_time, or step_time_quick with --quick)"
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.warmup = 2, 3, 1
    names = (
        args.families.split(",") if args.families else (QUICK_FAMILIES if args.quick else FAMILIES)
    )
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        ap.error(f"unknown families {unknown}; known: {','.join(FAMILIES)}")
    settings = {
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "batch_size": args.batch_size,
        "world_size": WORLD,
    }
    stem = args.name or ("step_time_quick" if args.quick else "step_time")
    raw_path = RESULTS / f"{stem}_raw.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw = json.loads(raw_path.read_text()) if raw_path.exists() else {"families": {}}
    for entry in raw["families"].values():  # files from before each family named its CPU
        entry.setdefault("cpu", raw["machine"]["device_name"])
    raw["settings"], raw["machine"] = settings, machine()
    prepare_machine_models()  # DreamShardPlanner's type choice reads them on rank 0
    start = time.perf_counter()
    signal.signal(signal.SIGTERM, _interrupt)  # a kill keeps the finished rounds, as Ctrl-C
    try:
        for name in names:
            run_family(name, raw, settings, raw_path)
            print("\n".join(family_lines(name, raw["families"][name])), flush=True)
    except KeyboardInterrupt:
        sys.exit(f"interrupted: finished rounds are in {raw_path}; run again to continue")
    raw["machine"] = machine()  # the load at the end
    raw_path.write_text(json.dumps(raw, indent=1) + "\n")
    # Every family taken with these settings, this run's and earlier runs'.
    done = {n: raw["families"][n] for n in FAMILIES if n in raw["families"]}
    done = {n: e for n, e in done.items() if e["settings"] == settings}
    text = report({**raw, "families": done}, args.quick, "python " + " ".join(sys.argv))
    (RESULTS / f"{stem}.md").write_text(text.rstrip() + "\n")
    print(f"wrote {raw_path} and {RESULTS / f'{stem}.md'} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
