"""``dreamshard plan``: plan a task's tables with :class:`DreamShardPlanner` and write the
plan TorchRec loads beside a summary of it."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchrec_dreamshard.cli._plan_args import (
    add_calibration_args,
    add_cluster_args,
    add_measuring_args,
    cluster_task,
    cluster_text,
    pricing_line,
    table_wise_only,
)
from torchrec_dreamshard.cli._plan_display import (
    check_plot_format,
    format_plan,
    plot_per_device,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.planner.adapters.task_inputs import TaskInputs


EXAMPLES = """examples:
  dreamshard plan task.json
  dreamshard plan task.json --out plan.json --plot plan.png   # also writes plan.torchrec.json
  dreamshard plan task.json --checkpoint my_gpus.pt --mode search --num-samples 32
  dreamshard plan task.json --no-splits      # whole tables only (table-wise)
  dreamshard plan task.json --calibrate --budget-s 60 --verify 4
  dreamshard plan task.json --no-calibrate   # no calibration (the reference kernel,
                                             # dense kernel and collectives still timed)
  dreamshard plan task.json --timeout 30     # the whole plan, measuring included
  dreamshard plan task.json --profile machine.profile   # plan from it: nothing timed
  dreamshard plan task.json --no-measure     # nothing timed: the checkpoint as it is
  dreamshard plan task.json --compute-device cuda --hosts 16 --local-world-size 8 \
      --profile gpu.profile                  # a GPU cluster, planned on a laptop

TASK.json: {"num_devices": 4, "memory_bytes": 17179869184, "global_batch_size": 2048,
            "tables": [{"name": "t0", "rows": 100000, "dim": 64, "pooling_factor": 12.5}]}
(global_batch_size is the global batch, a multiple of num_devices: TorchRec's planner
gets global_batch_size / num_devices per rank, its batch_size; memory_bytes one number or
one per device: each CPU rank's memory, or each GPU's HBM where "compute_device" is
"cuda", of which TorchRec's storage reservation keeps its share. A cluster: "hosts": 16,
"local_world_size": 8 in place of num_devices. Older files' "batch_size" key is read as
the global batch, with a deprecation warning.)
The first line printed says what prices the plan: a given profile, or the checkpoint
(measured against this machine, or not measured at all: --no-measure, or GPUs planned on
a machine without one).
The task is planned by DreamShardPlanner: its tables as one EmbeddingBagCollection
(table t0 fed by feature f_t0), the sharding-type choice and TorchRec's storage estimate
included. Without --checkpoint the checkpoint bundled with the package is used. By
default the checkpoint's prediction of a reference kernel is checked against this
machine and, where it is more than 25% off, the cost network is calibrated on the task's
tables first (half of what is left of the plan's budget, at most 20 s: the whole plan
measures for at most 25 s, --timeout sets it; measurements are kept, so re-planning them
measures nothing).
--out PLAN.json writes a summary: {"placement": {"t0": 2, ...}, "predicted_cost_ms": ...,
"per_device": [...], "adaptation": {...}}; tables split column-wise in
"shards": {"t0": [{"device": 0, "columns": [0, 64]}, ...]}, tables of other sharding
types in "sharding": {"t1": {"sharding_type": "data_parallel", "ranks": [0, 1]}}. Beside
it, PLAN.torchrec.json is the plan TorchRec's planner loads:
torchrec_dreamshard.planner.plans.plan_files.FilePlanLoader(path) as its plan_loader, in a
planner of the same inputs (torchrec_dreamshard.planner.adapters.task_inputs).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="place a task's tables and print the per-device predicted costs",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("task", metavar="TASK.json", help="the task file")
    p.add_argument("--checkpoint", metavar="PATH", help="agent checkpoint (default: bundled)")
    p.add_argument(
        "--out",
        metavar="PLAN.json",
        help="write the plan's summary as JSON, and beside it PLAN.torchrec.json, the plan "
        "TorchRec's planner loads (FilePlanLoader)",
    )
    p.add_argument("--plot", metavar="PLAN.png", help="per-device stacked bar chart")
    p.add_argument(
        "--mode",
        choices=("safe", "greedy", "search"),  # policy.agent.PLACEMENT_MODES
        default="safe",
        help="safe (default): policy, heuristics and TorchRec compete, chosen by the cost "
        "network penalised by its uncertainty; greedy: one policy roll-out; search: the "
        "policy's roll-outs, refined",
    )
    p.add_argument("--num-samples", type=int, default=4, help="sampled policy roll-outs")
    p.add_argument("--seed", type=int, default=0)
    add_cluster_args(p)
    add_calibration_args(p)
    p.add_argument(
        "--verify",
        type=int,
        default=None,
        metavar="K",
        help="measure the K best-rated candidate plans, the heuristics' plans and TorchRec's "
        "plan on real kernels (interleaved rounds); keep the fastest heuristic plan unless a "
        "plan beat it in every round, and no plan that did not beat TorchRec's beyond the "
        "noise (default: 2 plans within 25 s, cached, where the automatic check calibrates; "
        "0: never)",
    )
    p.add_argument("--verify-rounds", type=int, default=3, help="rounds of the verification")
    add_measuring_args(p)
    p.add_argument(
        "--no-splits",
        action="store_true",
        help="place whole tables only (every table table-wise: no column-wise splits, no "
        "other sharding type)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torchrec.distributed.planner.types import PlannerError
    from torchrec.distributed.sharding_plan import get_default_sharders

    from torchrec_dreamshard.data.tasks import Task
    from torchrec_dreamshard.planner.adapters.task_inputs import task_inputs
    from torchrec_dreamshard.planner.adapters.torchrec_adapter import quiet_torchrec
    from torchrec_dreamshard.planner.steps.profile_step import given_profile

    check_arguments(args)
    torchrec_out = torchrec_plan_path(args.out) if args.out else None
    check_outputs(args, torchrec_out)
    task = cluster_task(Task.load(args.task, allow_oversized=not args.no_splits), args)
    inputs = task_inputs(task)
    profile = given_profile(args.profile)
    print(pricing_line(args, task, profile))
    planner = task_planner(inputs, args, profile)
    start = time.perf_counter()
    try:
        with quiet_torchrec():
            plan = planner.plan(inputs.model, get_default_sharders())
    except PlannerError as exc:  # the tables do not fit: a message for the user
        raise ValueError(f"{args.task}: {exc}") from exc
    seconds = time.perf_counter() - start
    summary = plan_summary_dict(planner, plan, inputs)
    print(
        f"placed {len(task.tables)} tables on {task.num_devices} devices ({cluster_text(task)}) "
        f"in {seconds:.3f}s "
        f"({args.mode}, checkpoint: {args.checkpoint or 'bundled'})"
    )
    show_plan(args, planner, summary)
    if torchrec_out is not None:
        write_torchrec_plan(planner, torchrec_out)
    return 0


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse flags out of range, and ``--budget-s`` / ``--store`` without ``--calibrate``."""
    if args.num_samples < 0:
        raise ValueError(f"--num-samples must be >= 0, got {args.num_samples}")
    if (args.verify is not None and args.verify < 0) or args.verify_rounds < 1:
        raise ValueError(
            f"--verify must be >= 0 and --verify-rounds >= 1, got {args.verify}, "
            f"{args.verify_rounds}"
        )
    if args.timeout is not None and not args.timeout > 0:
        raise ValueError(f"--timeout must be a number of seconds > 0, got {args.timeout}")
    if not args.calibrate and (args.budget_s is not None or args.store is not None):
        raise ValueError(
            "--budget-s and --store apply to --calibrate; the automatic calibration measures "
            "for at most 20 s into the default store ($DREAMSHARD_CALIBRATION_STORE or "
            "~/.cache/torchrec_dreamshard/calibration.sqlite)"
        )


def check_outputs(args: argparse.Namespace, torchrec_out: Path | None) -> None:
    """Fail before planning where an output cannot be written."""
    from torchrec_dreamshard.io import check_writable

    outputs = ((args.out, "--out file"), (torchrec_out, "TorchRec plan file"))
    for path, what in (*outputs, (args.plot, "--plot file")):
        if path:
            check_writable(path, what)
    if args.plot:
        check_plot_format(args.plot)


def torchrec_plan_path(out: str | Path) -> Path:
    """Where the plan TorchRec loads goes: ``plan.json`` -> ``plan.torchrec.json``."""
    path = Path(out)
    stem = path.name[: -len(path.suffix)] if path.suffix else path.name
    return path.with_name(f"{stem}.torchrec.json")


def calibrate_argument(args: argparse.Namespace) -> Any:
    """The planner's ``calibrate``: ``None`` (automatic), ``False`` (``--no-calibrate``) or a
    ``CalibrationConfig`` of ``--budget-s`` (default 60) and ``--store``."""
    from torchrec_dreamshard.calibration import CalibrationConfig
    from torchrec_dreamshard.measure.config import MeasureConfig

    if args.calibrate is None or args.calibrate is False:
        return args.calibrate
    budget = 60.0 if args.budget_s is None else args.budget_s
    return CalibrationConfig(
        budget_s=budget, store=args.store, seed=args.seed, measure=MeasureConfig(device="cpu")
    )


def task_planner(
    inputs: TaskInputs, args: argparse.Namespace, profile: Any = None
) -> DreamShardPlanner:
    """The ``DreamShardPlanner`` of the task's ``inputs`` and the flags (``profile``: the
    loaded ``--profile``, else its path is passed)."""
    from torchrec_dreamshard.planner import DreamShardPlanner

    arguments = inputs.planner_arguments()
    if args.no_splits:
        arguments["constraints"] = table_wise_only(inputs.constraints)
    return DreamShardPlanner(
        **arguments,
        timeout_seconds=args.timeout,
        checkpoint=args.checkpoint,
        mode=args.mode,
        num_samples=args.num_samples,
        seed=args.seed,
        calibrate=calibrate_argument(args),
        verify=args.verify,
        profile=profile if profile is not None else args.profile,
        measure=not args.no_measure,
        cache_dir=args.cache_dir,
        verify_rounds=args.verify_rounds,
    )


def plan_summary_dict(planner: DreamShardPlanner, plan: Any, inputs: TaskInputs) -> dict[str, Any]:
    """The ``--out`` summary: the plan, candidates, adaptation, calibration and verification."""
    from torchrec_dreamshard.planner.adapters.device_memory import device_capacity, memory_tier
    from torchrec_dreamshard.planner.plans.plan_summary import plan_summary

    prediction = planner.last_prediction
    if prediction is None:
        raise ValueError("the planner made no prediction of its plan (no table to plan)")
    topology = inputs.topology
    summary = plan_summary(
        plan, planner.best_options, prediction, device_capacity(topology), memory_tier(topology)
    )
    report = planner.agent.last_report
    # the safety net's report is of a whole-table placement: only unsplit plans carry it
    if report is not None and report.candidates and not summary.get("shards"):
        summary["candidates"] = report.to_dict()
    summary["adaptation"] = planner.adaptation
    calibration = measured_calibration(planner)
    if calibration is not None:
        summary["calibration"] = {k: v for k, v in calibration.items() if k != "lines"}
    verification = planner.last_verification
    if verification is not None:
        summary["verification"] = verification.to_dict()
    return summary


def measured_calibration(planner: DreamShardPlanner) -> dict[str, Any] | None:
    """What this plan's profile step calibrated here (its record and ``lines``), or ``None``."""
    profile = planner.profile
    if profile is None or profile.calibration is None or planner.adaptation.get("profile_given"):
        return None
    return profile.calibration.record or None


def show_plan(args: argparse.Namespace, planner: DreamShardPlanner, summary: dict) -> None:
    """Print the plan and what its measuring took and bought; write ``--out`` and ``--plot``."""
    from torchrec_dreamshard.calibration.adaptation_report import adaptation_lines
    from torchrec_dreamshard.io import atomic_write, dumps_strict

    print("\n".join(line for line in adaptation_lines(summary["adaptation"]) if line))
    if summary.get("shards"):
        split = ", ".join(f"{name} x{len(s)}" for name, s in summary["shards"].items())
        print(f"split column-wise: {split}")
    for name, other in summary.get("sharding", {}).items():
        print(f"{name}: {other['sharding_type']} on ranks {other['ranks']}")
    print(format_plan(summary))
    if "candidates" in summary:
        print("\n".join(planner.agent.last_report.lines()))
    calibration = measured_calibration(planner)
    if calibration is not None:
        print("\n".join(calibration.get("lines", [])))
    if planner.last_verification is not None:
        print("\n".join(planner.last_verification.lines()))
    if args.out:
        summary["torchrec_plan"] = torchrec_plan_path(args.out).name
        atomic_write(args.out, dumps_strict(summary), "--out file")
        print(f"wrote {args.out}")
    if args.plot:
        plot_per_device(summary["per_device"], args.plot, f"{Path(args.task).name}: predicted")
        print(f"wrote {args.plot}")


def write_torchrec_plan(planner: DreamShardPlanner, path: Path) -> None:
    """Write the plan TorchRec's planner loads to ``path``."""
    from torchrec_dreamshard.planner.plans.plan_files import write_plan_file

    write_plan_file(path, planner.best_options, planner.hash_planner_context_inputs_str())
    print(f"wrote {path} (TorchRec's PlanLoader: torchrec_dreamshard.planner.plans.plan_files)")
