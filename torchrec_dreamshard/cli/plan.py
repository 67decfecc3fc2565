"""``dreamshard plan``: plan a task's tables with :class:`DreamShardPlanner`, as a training
job plans its model, and write the plan TorchRec loads beside a summary of it."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """``--compute-device``, ``--hosts`` and ``--local-world-size``: the cluster, over the
    task file's."""
    p.add_argument(
        "--compute-device",
        choices=("cpu", "cuda"),
        default=None,
        help="what the devices are (over the task file's compute_device, default cpu): on "
        "cuda memory_bytes is each GPU's HBM; planning for GPUs needs no GPU",
    )
    p.add_argument(
        "--hosts",
        type=int,
        default=None,
        metavar="N",
        help="hosts of --local-world-size devices each (with it; num_devices is hosts x "
        "local world size)",
    )
    p.add_argument(
        "--local-world-size",
        type=int,
        default=None,
        metavar="N",
        help="devices per host (over the task file's local_world_size)",
    )


def add_calibration_args(p: argparse.ArgumentParser, flag: bool = True) -> None:
    """``--calibrate/--no-calibrate`` (when ``flag``), ``--budget-s`` and ``--store``."""
    if flag:
        p.add_argument(
            "--calibrate",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="first measure the task's tables on this machine and fine-tune the cost "
            "network on them (re-uses earlier measurements in the store); default: only "
            "where the checkpoint misprices this machine's reference kernel by over 25%%. "
            "--no-calibrate fine-tunes nothing, but still times the reference kernel and, "
            "where sharding types other than table-wise are offered, the dense kernel, the "
            "collectives and the sharding path (each cached per machine); --no-measure "
            "times nothing",
        )
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="calibration time budget in seconds (default 60)",
    )
    p.add_argument(
        "--store",
        metavar="PATH",
        help="calibration store (default: $DREAMSHARD_CALIBRATION_STORE or "
        "~/.cache/torchrec_dreamshard/calibration.sqlite)",
    )


def add_measuring_args(p: argparse.ArgumentParser) -> None:
    """What bounds and feeds the planner's measuring: ``--timeout``, ``--profile``,
    ``--no-measure``, ``--cache-dir``."""
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the planner's timeout_seconds: it bounds the whole plan, measuring included",
    )
    p.add_argument(
        "--profile",
        metavar="PATH",
        help="a machine profile (dreamshard profile --out) to plan from, measuring nothing",
    )
    p.add_argument(
        "--no-measure",
        action="store_true",
        help="time nothing: the checkpoint's kernels as they are and analytic collectives "
        "from the topology's bandwidths (no calibration, no verification)",
    )
    p.add_argument("--cache-dir", metavar="DIR", help="where measurements are cached")


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


def cluster_task(task: Any, args: argparse.Namespace) -> Any:
    """``task`` on the cluster the flags describe (``--compute-device``, ``--hosts`` with
    ``--local-world-size``), over the task file's.

    Raises:
        ValueError: ``--hosts`` without ``--local-world-size``, or a cluster the task's
            memory list does not fit (one entry per device).
    """
    import dataclasses

    if args.hosts is not None and args.local_world_size is None:
        raise ValueError("--hosts needs --local-world-size (devices per host)")
    changes: dict[str, Any] = {}
    if args.compute_device is not None:
        changes["compute_device"] = args.compute_device
    if args.local_world_size is not None:
        changes["local_world_size"] = args.local_world_size
    if args.hosts is not None:
        changes["num_devices"] = args.hosts * args.local_world_size
    if not changes:
        return task
    try:
        return dataclasses.replace(task, **changes)
    except ValueError as exc:
        raise ValueError(f"{args.task} with the cluster flags: {exc}") from None


def cluster_text(task: Any) -> str:
    """``"cuda, 16 hosts of 8"``: what the task's devices are and how they are hosted."""
    hosts = task.hosts
    per_host = task.num_devices // hosts
    return f"{task.compute_device}, {hosts} host{'s' if hosts > 1 else ''} of {per_host}"


def pricing_line(args: argparse.Namespace, task: Any, profile: Any) -> str:
    """The first line ``dreamshard plan`` prints: what prices the plan, and whether any of
    it was measured on the devices planned for."""
    import torch

    checkpoint = (
        f"checkpoint {args.checkpoint}'s" if args.checkpoint else "bundled CPU checkpoint's"
    )
    cluster = f"{task.num_devices} devices ({cluster_text(task)})"
    if profile is not None:
        stamp = profile.stamp
        return (
            f"prices: the profile {args.profile} (measured on {stamp.device} "
            f"{stamp.device_name}) for {cluster}; nothing is timed here"
        )
    if args.no_measure:
        why = "--no-measure"
    elif task.compute_device == "cuda" and not torch.cuda.is_available():
        why = "no GPU here; --profile GPU.profile from `dreamshard profile` on one GPU node"
    elif args.calibrate is None:
        return (
            f"prices: the {checkpoint} cost network for {cluster}, checked against this "
            "machine's reference kernel and calibrated on the task's tables here where it "
            "misprices it"
        )
    elif args.calibrate:
        return f"prices: the {checkpoint} cost network, calibrated on this machine for {cluster}"
    else:
        return (
            f"prices: the {checkpoint} cost network as it is for {cluster} (--no-calibrate; "
            "this machine's collectives and dense kernel are timed where other sharding "
            "types are offered)"
        )
    return (
        f"prices: the {checkpoint} cost network, not measured on this cluster of {cluster} ({why})"
    )


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse flags out of range, and ``--budget-s`` / ``--store`` where they have no
    effect (the automatic calibration's budget and store are the planner's defaults)."""
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
    """Fail before planning where an output cannot be written, so a bad path never costs
    the work."""
    from torchrec_dreamshard.io import check_writable

    outputs = ((args.out, "--out file"), (torchrec_out, "TorchRec plan file"))
    for path, what in (*outputs, (args.plot, "--plot file")):
        if path:
            check_writable(path, what)
    if args.plot:
        check_plot_format(args.plot)


def torchrec_plan_path(out: str | Path) -> Path:
    """Where the plan TorchRec loads goes beside the summary ``out``:
    ``plan.json`` -> ``plan.torchrec.json``."""
    path = Path(out)
    stem = path.name[: -len(path.suffix)] if path.suffix else path.name
    return path.with_name(f"{stem}.torchrec.json")


def calibrate_argument(args: argparse.Namespace) -> Any:
    """The planner's ``calibrate``: ``None`` (automatic) unless ``--calibrate`` (a
    ``CalibrationConfig`` of ``--budget-s``, default 60, and ``--store``) or
    ``--no-calibrate`` (``False``)."""
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
    """The ``DreamShardPlanner`` of the task's ``inputs`` and the flags: ``--checkpoint``,
    ``--mode``, ``--num-samples``, ``--seed``, ``--calibrate``, ``--verify`` (its rounds:
    ``--verify-rounds``), ``--timeout`` (``timeout_seconds``), ``--profile``,
    ``--no-measure`` (``measure=False``), ``--cache-dir``; ``--no-splits`` constrains
    every table to table-wise. ``profile``: ``--profile`` loaded (else the path is
    passed)."""
    import dataclasses

    from torchrec_dreamshard.planner import DreamShardPlanner

    arguments = inputs.planner_arguments()
    if args.no_splits:
        arguments["constraints"] = {
            name: dataclasses.replace(c, sharding_types=["table_wise"])
            for name, c in inputs.constraints.items()
        }
    planner = DreamShardPlanner(
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
    return planner


def plan_summary_dict(planner: DreamShardPlanner, plan: Any, inputs: TaskInputs) -> dict[str, Any]:
    """The ``--out`` summary: :func:`~torchrec_dreamshard.planner.plans.plan_summary.plan_summary`
    of the plan, the safety net's candidates, how the planner adapted to this machine and
    what calibration and verification did."""
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
    # the safety net's report describes a whole-table placement: where tables were split,
    # the policy placed their shards again after it, so only unsplit plans carry it
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
    """What this plan's profile step calibrated (its record and printed ``lines``), or
    ``None`` where it calibrated nothing here (none, or a given profile)."""
    profile = planner.profile
    if profile is None or profile.calibration is None or planner.adaptation.get("profile_given"):
        return None
    return profile.calibration.record or None


def show_plan(args: argparse.Namespace, planner: DreamShardPlanner, summary: dict) -> None:
    """Print what the planning's measuring took and bought, the plan, the safety net's
    report and what calibration and verification did; then write ``--out`` and
    ``--plot``."""
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
    """Write the plan TorchRec's planner loads
    (:func:`~torchrec_dreamshard.planner.plans.plan_files.write_plan_file`) to ``path``."""
    from torchrec_dreamshard.planner.plans.plan_files import write_plan_file

    write_plan_file(path, planner.best_options, planner.hash_planner_context_inputs_str())
    print(f"wrote {path} (TorchRec's PlanLoader: torchrec_dreamshard.planner.plans.plan_files)")
