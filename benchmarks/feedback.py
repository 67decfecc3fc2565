"""The job as the measurement: what observing costs, how far the prediction moves toward
what the job measures, and whether the re-plan's training step beats the first plan's.

For each step-time family (``harness.step_families``), on 2 gloo ranks
spawned on this machine, one thread each:

1. ``DreamShardPlanner.collective_plan`` plans the model (the default planner, which
   calibrates where the checkpoint misprices this machine; ``--no-calibrate`` plans with
   the checkpoint as it is, the case where the prior misprices most);
2. the model trains under ``TrainPipelineSparseDist`` in alternating rounds
   (``--overhead-rounds``, default ``--rounds``) of ``--steps`` steps with
   ``observer.step()`` after each step and without it, the order alternating round by
   round: the per-round ratio of the step time with to without is the observer's
   overhead (every step of the "with" runs counts, the sampled ones included);
3. a new observer (the defaults, as a new job has it) for ``--steps`` steps (40: four
   sampled steps, the observer's first ones coming one step in 5), then
   ``observer.report()`` (the per-rank error of the prediction as planned),
   ``observer.replan()`` and ``observer.report()`` again (the error of the updated model
   on the observed plan); then the same with the observer of step 2, which
   has watched every "on" round (tens of sampled steps): its re-plan is the one timed;
4. where the re-plan returned a new plan: the job restarted with it, observed
   (``observer.follow``) for ``--steps`` steps against the updated network's prediction of
   it, made before it ran (the error out of sample); a fresh planner of the same arguments
   plans the model again, as a restarted training script would (does it find the re-plan
   from what the store kept?); and the plans' DMP steps (first, re-plan, and the restart's
   where it differs) in ``--rounds`` rounds
   (``evaluation.dmp_step.run_rounds``, orders balanced), per-round ratio re-plan / first.

The ``undeclared`` family is where the prior misprices most: its planners are told no
pooling factor (TorchRec's 1.0), and its job feeds four tables 40 to 100 ids a sample.

    .venv/bin/python benchmarks/feedback.py       # tiny, wide, sequence, undeclared
    .venv/bin/python benchmarks/feedback.py --families tiny --no-calibrate --name feedback_prior

Writes ``benchmarks/results/<name>.json`` (raw) and ``<name>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from torchrec_dreamshard.evaluation.step_stats import median_interval, ratio_interval
from torchrec_dreamshard.measure.hardware import cpu_name

from harness.results_files import RESULTS
from harness.step_families import FAMILIES, WORLD, family_spec

BATCH = 512  # per rank
EVERY = 20  # the observer's default sampling


def timed_steps(pipeline: Any, batches: list, steps: int, observer: Any = None) -> float:
    """Mean step ms over ``steps`` steps (the slowest rank's), calling ``observer.step()``
    after each when given. A sample the last step opened is finished by one more step
    inside the timed region, as a job that goes on would finish it: every sample of the
    round is whole (no sample runs into the next round, none is paid and thrown away)."""
    stream = iter([batches[i % len(batches)] for i in range(steps + 6)])
    for _ in range(2):  # warm-up
        pipeline.progress(stream)
    dist.barrier()
    start = time.perf_counter()
    done = 0
    while done < steps or (observer is not None and observer.sampling):
        pipeline.progress(stream)
        done += 1
        if observer is not None:
            observer.step()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    for _ in range(2):  # drain the pipeline
        pipeline.progress(stream)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item()) * 1e3 / done


def run_family(spec: Any, args: dict) -> dict:
    """Steps 1 to 4 on this rank (every rank calls it; rank 0's result is kept)."""
    from torchrec.distributed.sharding_plan import get_default_sharders

    from torchrec_dreamshard.evaluation.dmp_step import StepTimerConfig, build_pipeline, run_rounds
    from torchrec_dreamshard.evaluation.step_model import StepDLRM, make_batch
    from torchrec_dreamshard.feedback.observed_job_report import rank_tables
    from torchrec_dreamshard.feedback.observer import observe
    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.planner.adapters.topology import torchrec_topology

    torch.set_num_threads(1)

    def new_planner():
        return DreamShardPlanner(
            topology=torchrec_topology(WORLD, "cpu"),
            batch_size=BATCH,
            constraints=spec.planner_constraints(),
            calibrate=None if args["calibrate"] else False,
        )

    def plan_model(planner):
        model = StepDLRM(spec, torch.device("meta"))
        return planner.collective_plan(model, get_default_sharders(), dist.GroupMember.WORLD)

    planner = new_planner()
    plan = plan_model(planner)
    pipeline = build_pipeline(spec, plan, 0.01)
    batches = [make_batch(spec, BATCH, 1000 * dist.get_rank() + i) for i in range(8)]
    observer = observe(planner, pipeline._model, every=EVERY, warmup=0)
    on, off = [], []
    for r in range(args.get("overhead_rounds") or args["rounds"]):
        for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
            watcher = observer if mode == "on" else None
            (on if mode == "on" else off).append(
                timed_steps(pipeline, batches, args["steps"], watcher)
            )
    out = {"adaptation": planner.adaptation, "on_ms": on, "off_ms": off}
    # what sampling cost by the observer's own measure, over the steps it observed (the
    # "off" rounds between are not the observer's: its overhead figure would count them)
    out["sampling_ms"] = observer.sampling_ms
    out["observed_ms"] = sum(on) * args["steps"]
    out["interval"] = observer.interval
    observer.close()
    # learning from --steps steps: a new observer, as a new job has it, then report, replan
    short = observe(planner, pipeline._model, every=EVERY)
    timed_steps(pipeline, batches, args["steps"], short)
    out["before"] = short.report()
    short.replan()
    out["after"] = short.report()
    short.close()
    # learning from every step the overhead rounds observed: the re-plan that is timed
    out["long_before"] = observer.report()
    new_plan = observer.replan()
    out["long_after"] = observer.report()
    out["observed_steps"] = observer.steps
    out["first_tables"] = rank_tables(plan, WORLD)
    del pipeline
    if str(new_plan) != str(plan):
        out["replan_tables"] = rank_tables(new_plan, WORLD)
        restarted = build_pipeline(spec, new_plan, 0.01)
        observer.follow(restarted._model, new_plan)
        timed_steps(restarted, batches, args["steps"], observer)
        out["restarted"] = observer.report()
        del restarted
        again = new_planner()
        restart_plan = plan_model(again)
        out["replanned_at_restart"] = rank_tables(restart_plan, WORLD)
        out["restart_adaptation"] = again.adaptation
        plans = {"first": plan, "replan": new_plan}
        if str(restart_plan) != str(new_plan):  # timed too: what a restarted script runs
            plans["restart"] = restart_plan
        config = StepTimerConfig(batch_size=BATCH, rounds=args["rounds"], steps=args["steps"])
        times = run_rounds(spec, plans, config)
        out["step_ms"] = {name: [r["step_ms"][name] for r in times.rounds] for name in plans}
    return out


def _rank(rank: int, world: int, port: int, job: tuple) -> None:
    from torchrec_dreamshard.ranks.spawn import exit_spawned_rank, local_process_group

    spec, args, out = job
    warnings.filterwarnings("ignore")
    with local_process_group(rank, world, port):
        result = run_family(spec, args)
        if rank == 0:
            Path(out).write_text(json.dumps(result))
    exit_spawned_rank()


def measure_family(name: str, args: dict) -> dict:
    import torch.multiprocessing as mp

    from torchrec_dreamshard.ranks.spawn import free_port

    spec = family_spec(name, BATCH)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        job = (spec, args, str(out))
        mp.spawn(_rank, args=(WORLD, free_port(), job), nprocs=WORLD, join=True)
        return json.loads(out.read_text())


def summary(result: dict) -> dict:
    """The family's figures: overhead, errors, decision, re-plan / first."""
    overhead = ratio_interval(result["on_ms"], result["off_ms"])
    runs = [k for k in ("before", "after", "long_after", "restarted") if k in result]
    worst = {k: max(abs(r["error"]) for r in result[k]["ranks"]) for k in runs}
    row = {"overhead": overhead.to_dict(), "worst_error": worst}
    if "sampling_ms" in result:
        row["self_overhead"] = result["sampling_ms"] / max(
            result["observed_ms"] - result["sampling_ms"], 1e-9
        )
        row["interval"] = result["interval"]
    row["decision"] = result.get("long_after", result["after"]).get("replan", {})
    row["decision_short"] = result["after"].get("replan", {})
    if "long_after" in result:
        row["long_samples"] = result["long_after"]["steps_observed"]
        row["long_steps"] = result["observed_steps"]
    if "step_ms" in result:
        row["replan_over_first"] = ratio_interval(
            result["step_ms"]["replan"], result["step_ms"]["first"]
        ).to_dict()
        row["first_ms"] = median_interval(result["step_ms"]["first"]).to_dict()
        row["restart_plans_the_replan"] = result["replanned_at_restart"] == result["replan_tables"]
        if "restart" in result["step_ms"]:
            row["restart_over_first"] = ratio_interval(
                result["step_ms"]["restart"], result["step_ms"]["first"]
            ).to_dict()
    return row


def markdown(report: dict) -> str:
    planner = (
        "default (automatic calibration)"
        if report["args"]["calibrate"]
        else "the checkpoint as it is (--no-calibrate)"
    )
    lines = [
        "# Learning from the job: observer overhead, per-rank error, re-plan "
        "(`benchmarks/feedback.py`)",
        "",
        f"{report['cpu']}, {report['cores']} cores, 2 gloo ranks, per-rank batch {BATCH}, "
        f"{report['args'].get('overhead_rounds') or report['args']['rounds']} alternating "
        f"rounds of {report['args']['steps']} steps with and without the observer, "
        f"{report['args']['rounds']} of the plans' steps; planner: {planner}. "
        "Ratios: median over rounds of the per-round ratio [order-statistic interval, its "
        "coverage]. Sampling's cost, the observer's own measure: each sampled step's time "
        "beyond the median plain step, summed, over the observed steps' time (rank 0), "
        "with the interval the observer settled on. Error: |predicted / measured - 1| of "
        "each rank's embedding part (fused fwd + bwd + the all-to-alls' own time + the "
        "data-parallel tables' kernel), the worst rank; 'restarted': the job restarted "
        "with the re-plan, against the updated network's prediction of it made before it "
        "ran. Restart: whether a fresh planner of the same arguments (a restarted script) "
        "plans the re-plan's layout from what the store kept (else its plan's step over the "
        "first plan's, timed in the same rounds).",
        "",
        "| family | observer on / off | sampling's cost, the observer's own measure "
        "(one step in N) | worst error, as planned | after 40 steps and replan() | after "
        "every observed step and replan() | restarted | re-plan | re-plan / first step | "
        "restart |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in report["families"].items():
        o, d = row["overhead"], row["decision"]
        change = f"new plan ({d.get('why', '')})" if d.get("changed") else "kept the plan"
        ratio = row.get("replan_over_first")
        ratio_text = _interval(ratio) if ratio else "- (same plan)"
        own = (
            f"{row['self_overhead']:.2%} (N = {row['interval']})" if "self_overhead" in row else "-"
        )
        worst = row["worst_error"]
        restarted = f"{worst['restarted']:.0%}" if "restarted" in worst else "-"
        restart = row.get("restart_plans_the_replan")
        restart_text = "-" if restart is None else "the re-plan's"
        if "restart_over_first" in row:
            restart_text = f"another plan: {_interval(row['restart_over_first'])} of first"
        long = (
            f"{worst['long_after']:.0%} ({row['long_samples']} sampled of {row['long_steps']})"
            if "long_after" in worst
            else "-"
        )
        lines.append(
            f"| {name} | {_interval(o)} | {own} | {worst['before']:.0%} | "
            f"{worst['after']:.0%} | {long} | {restarted} | {change} | {ratio_text} | "
            f"{restart_text} |"
        )
    lines += ["", f"Wall time {report['wall_s']:.0f} s. Raw: `{report['name']}.json`."]
    return "\n".join(lines) + "\n"


def _interval(i: dict) -> str:
    return f"{i['median']:.3f} [{i['low']:.3f}, {i['high']:.3f}; {i['coverage']:.0%}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=["tiny", "wide", "sequence", "undeclared"])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument(
        "--overhead-rounds",
        type=int,
        default=None,
        help="rounds of the overhead's on/off comparison (default --rounds): its per-round "
        "ratio moves 3-5%% here, and a 2%% bound needs about a hundred",
    )
    parser.add_argument("--calibrate", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--name", default="feedback")
    args = parser.parse_args()
    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}; known: {list(FAMILIES)}")
    settings = {"rounds": args.rounds, "steps": args.steps, "calibrate": args.calibrate}
    if args.overhead_rounds:
        settings["overhead_rounds"] = args.overhead_rounds
    start = time.perf_counter()
    raw, families = {}, {}
    path = RESULTS / f"{args.name}.json"
    if path.exists():  # families measured by an earlier run with the same settings are kept
        kept = json.loads(path.read_text())
        if kept.get("args") == settings and kept.get("cpu") == cpu_name():
            raw, families = kept["raw"], kept["families"]
    for name in args.families:
        raw[name] = measure_family(name, settings)
        families[name] = summary(raw[name])
        print(name, json.dumps(families[name]), flush=True)
        report = {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "args": settings,
            "name": args.name,
            "families": families,
            "raw": raw,
            "wall_s": time.perf_counter() - start,
        }
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=1))
        (RESULTS / f"{args.name}.md").write_text(markdown(report))
    print((RESULTS / f"{args.name}.md").read_text())


if __name__ == "__main__":
    main()
