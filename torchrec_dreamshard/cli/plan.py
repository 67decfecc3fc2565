"""``dreamshard plan``: place a task's tables with a trained DreamShard agent."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.calibration import PlanOutcome, VerificationSettings
    from torchrec_dreamshard.data.tasks import Task
    from torchrec_dreamshard.policy import PlacementAgent, SafetyReport
    from torchrec_dreamshard.policy.split_search import SplitPlan

EXAMPLES = """examples:
  dreamshard plan task.json
  dreamshard plan task.json --out plan.json --plot plan.png
  dreamshard plan task.json --checkpoint my_gpus.pt --mode search --num-samples 32
  dreamshard plan task.json --no-splits      # whole tables only (table-wise)
  dreamshard plan task.json --calibrate --budget-s 60 --verify 4
  dreamshard plan task.json --no-calibrate   # the checkpoint as it is, measuring nothing

TASK.json: {"num_devices": 4, "memory_bytes": 17179869184, "batch_size": 2048,
            "tables": [{"name": "t0", "rows": 100000, "dim": 64, "pooling_factor": 12.5}]}
(batch_size is the global batch; memory_bytes one number or one per device).
Without --checkpoint the checkpoint bundled with the package is used. By default the
checkpoint's prediction of a reference kernel is checked against this machine (measured
once, cached) and, where it is more than 25% off, the cost network is calibrated on the
task's tables first (20 s; measurements are kept, so re-planning them measures nothing).
Tables may be split column-wise (a table bigger than every device always is; others when
the cost network predicts a faster step); PLAN.json then also holds
"shards": {"t0": [{"device": 0, "columns": [0, 64]}, {"device": 3, "columns": [64, 128]}]}.
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
    p.add_argument("--out", metavar="PLAN.json", help="write the plan as JSON")
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
    p.add_argument(
        "--no-splits",
        action="store_true",
        help="place whole tables only (no column-wise splits)",
    )
    p.set_defaults(func=run)


def add_calibration_args(p: argparse.ArgumentParser, flag: bool = True) -> None:
    """``--calibrate/--no-calibrate`` (when ``flag``), ``--budget-s`` and ``--store``."""
    if flag:
        p.add_argument(
            "--calibrate",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="first measure the task's tables on this machine and fine-tune the cost "
            "network on them (re-uses earlier measurements in the store); default: only "
            "where the checkpoint misprices this machine's reference kernel by over 25%%",
        )
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="calibration time budget in seconds (default 60; 20 when calibrating automatically)",
    )
    p.add_argument(
        "--store",
        metavar="PATH",
        help="calibration store (default: $DREAMSHARD_CALIBRATION_STORE or "
        "~/.cache/torchrec_dreamshard/calibration.sqlite)",
    )


def run(args: argparse.Namespace) -> int:
    from torchrec_dreamshard.data.tasks import Task
    from torchrec_dreamshard.io import check_writable
    from torchrec_dreamshard.planner.candidates import default_sources
    from torchrec_dreamshard.policy.checkpoint import load_checkpoint

    if args.num_samples < 0:
        raise ValueError(f"--num-samples must be >= 0, got {args.num_samples}")
    # outputs are checked before planning, so a bad path never costs the work
    for path, what in ((args.out, "--out file"), (args.plot, "--plot file")):
        if path:
            check_writable(path, what)
    if args.plot:
        check_plot_format(args.plot)
    task = Task.load(args.task, allow_oversized=not args.no_splits)
    from torchrec_dreamshard.calibration import plan_task
    from torchrec_dreamshard.policy.protocol import PlaceSettings

    if (args.verify is not None and args.verify < 0) or args.verify_rounds < 1:
        raise ValueError(
            f"--verify must be >= 0 and --verify-rounds >= 1, got {args.verify}, "
            f"{args.verify_rounds}"
        )
    agent = load_checkpoint(args.checkpoint, sources=default_sources())
    start = time.perf_counter()
    calibration, adaptation = calibration_settings(agent, args)
    verification = verify_settings(args.verify, adaptation, calibration, args.verify_rounds)
    k = verification.k
    outcome = plan_task(
        agent,
        task,
        how=PlaceSettings(args.mode, args.num_samples, args.seed),
        calibration=calibration,
        verification=verification,
        progress=True,
        splits=not args.no_splits,
    )
    if outcome.calibration is not None:
        adaptation.update(
            calibrated=True,
            kernel_mape_before=outcome.calibration.before.get("cost/mape"),
            kernel_mape_after=outcome.calibration.after.get("cost/mape"),
            kernels_discarded=outcome.calibration.discarded,
            calibration_note=outcome.calibration.note,
        )
    if outcome.margins:
        adaptation["margins"] = outcome.margins
    adaptation["summary"] = outcome.summary()
    plan, report = plan_file(task, outcome, adaptation)
    if k and plan.get("shards"):
        print("--verify: skipped, it compares whole-table plans and this plan splits tables")
    seconds = time.perf_counter() - start
    print(
        f"placed {len(task.tables)} tables on {task.num_devices} devices in {seconds:.3f}s "
        f"({args.mode}, checkpoint: {args.checkpoint or 'bundled'})"
    )
    for line in adaptation["summary"]:  # what the measuring took and bought
        print(line)
    show_plan(args, plan, report, outcome)
    return 0


def plan_file(
    task: Task, outcome: PlanOutcome, adaptation: dict[str, Any]
) -> tuple[dict[str, Any], SafetyReport | None]:
    """The PLAN.json contents of ``outcome`` (the split search's plan, whole tables in
    ``placement`` and split ones in ``shards``, unless verification chose another), with
    the safety net's report, the ``adaptation`` and what calibration and verification
    did; and that report."""
    agent = outcome.agent
    if outcome.split is not None and outcome.verification is None:
        plan = split_plan_dict(agent, outcome.split)
    else:
        plan = plan_dict(task, outcome.placement, agent.predict(task, outcome.placement))
    # the safety net's report describes the whole-table placement it chose; a split plan
    # is re-placed after the search, so only unsplit plans carry it
    report = None if plan.get("shards") else agent.last_report
    if report is not None:
        plan["candidates"] = report.to_dict()
    plan["adaptation"] = adaptation
    if outcome.calibration is not None:
        plan["calibration"] = outcome.calibration.to_dict()
    if outcome.verification is not None:
        plan["verification"] = outcome.verification.to_dict()
    return plan, report


def calibration_settings(
    agent: PlacementAgent, args: argparse.Namespace
) -> tuple[Any, dict[str, Any]]:
    """The calibration to run (``None``: none) and what decided it: ``--calibrate``
    always, ``--no-calibrate`` never, neither where the checkpoint misprices this
    machine's reference kernel (measured once, cached)."""
    from torchrec_dreamshard.calibration import CalibrationConfig, auto

    if args.calibrate is False:
        return None, {"mode": "off", "calibrated": False, "why": "--no-calibrate"}
    budget = args.budget_s
    if args.calibrate:
        adaptation = {"mode": "on", "calibrated": False, "why": "--calibrate"}
        budget = 60.0 if budget is None else budget
    else:
        check = auto.check_machine(agent, auto.measured_reference_ms())
        adaptation = {"mode": "auto", "calibrated": False, **check.to_dict(), "why": check.why()}
        print(check.why())
        if not check.mispriced:
            return None, adaptation
        budget = auto.AUTO_BUDGET_S if budget is None else budget
    config = CalibrationConfig(budget_s=budget, store=args.store, seed=args.seed)
    return config, adaptation


def show_plan(args: argparse.Namespace, plan: dict[str, Any], report: Any, outcome: Any) -> None:
    """Print the plan, the safety net's report and what calibration and verification did,
    then write ``--out`` and ``--plot``."""
    from torchrec_dreamshard.io import atomic_write, dumps_strict

    if plan.get("shards"):
        split = ", ".join(f"{name} x{len(s)}" for name, s in plan["shards"].items())
        print(f"split column-wise: {split}")
    print(format_plan(plan))
    if report is not None:
        print("\n".join(report.lines()))
    if outcome.lines():
        print("\n".join(outcome.lines()))
    if args.out:
        atomic_write(args.out, dumps_strict(plan), "--out file")
        print(f"wrote {args.out}")
    if args.plot:
        plot_per_device(plan["per_device"], args.plot, f"{Path(args.task).name}: predicted")
        print(f"wrote {args.plot}")


def plan_dict(task: Any, placement: Sequence[int], prediction: Any) -> dict[str, Any]:
    """The PLAN.json contents: placement by table name, predicted step cost (ms) and
    each device's tables, bytes and predicted forward/backward/communication ms."""
    from torchrec_dreamshard.data.tasks import device_bytes, device_tables, placement_to_dict

    check_finite_prediction(task, placement, prediction)
    used = device_bytes(task, placement)
    per_device = []
    for d, idx in enumerate(device_tables(task, placement)):
        fwd, bwd, comm = prediction.fwd_ms[d], prediction.bwd_ms[d], prediction.comm_ms[d]
        per_device.append(
            {
                "device": d,
                "tables": [task.tables[i].name for i in idx],
                "bytes": used[d],
                "memory_bytes": task.memory[d],
                "fwd_ms": fwd,
                "bwd_ms": bwd,
                "comm_ms": comm,
                "total_ms": fwd + bwd + comm,
            }
        )
    return {
        "placement": placement_to_dict(task, placement),
        "predicted_cost_ms": float(prediction.step_ms),
        "per_device": per_device,
    }


def verify_settings(
    verify: int | None, adaptation: dict[str, Any], calibration: Any, rounds: int = 3
) -> VerificationSettings:
    """The verification's settings
    (:func:`~torchrec_dreamshard.calibration.auto.verification_settings`): ``--verify K``
    as given, else automatic where the automatic check calibrates; ``rounds``:
    ``--verify-rounds``."""
    from torchrec_dreamshard.calibration.auto import verification_settings

    auto_calibrates = adaptation.get("mode") == "auto" and calibration is not None
    return verification_settings(verify, auto_calibrates, rounds)


def split_plan_dict(agent: PlacementAgent, found: SplitPlan) -> dict[str, Any]:
    """The PLAN.json contents of a plan the split search found
    (:func:`torchrec_dreamshard.policy.split_search.plan_with_splits`): whole tables in
    ``placement``, split ones in ``shards`` (only when some table is split); ``per_device``
    lists shards by their names (``t0@0:64``)."""
    from torchrec_dreamshard.data.splits import plan_entries

    shards_task = found.sharded.shards
    plan = plan_dict(shards_task, found.placement, agent.predict(shards_task, found.placement))
    whole, shards = plan_entries(found.sharded, found.placement)
    plan["placement"] = whole
    if shards:
        plan = {"placement": whole, "shards": shards, **plan}
    return plan


def check_finite_prediction(task: Any, placement: Sequence[int], prediction: Any) -> None:
    """Refuse a prediction holding NaN or infinity, naming the tables that caused it.

    Raises:
        ValueError: the device(s) whose predicted times are not finite and their tables
            (those whose own features are not finite first).
    """
    from torchrec_dreamshard.data.tables import table_features
    from torchrec_dreamshard.data.tasks import device_tables

    figures = [prediction.step_ms, *prediction.fwd_ms, *prediction.bwd_ms, *prediction.comm_ms]
    if all(math.isfinite(float(x)) for x in figures):
        return
    feats = table_features(task.tables, task.batch_size)
    culprits = [
        t.name
        for t, row in zip(task.tables, feats, strict=True)
        if not all(map(math.isfinite, row))
    ]
    if not culprits:
        for d, idx in enumerate(device_tables(task, placement)):
            per = (prediction.fwd_ms[d], prediction.bwd_ms[d], prediction.comm_ms[d])
            if not all(math.isfinite(float(x)) for x in per):
                culprits += [task.tables[i].name for i in idx]
    raise ValueError(
        f"the cost network's prediction is not finite (NaN or infinity) for tables "
        f"{culprits[:20]}{' ...' if len(culprits) > 20 else ''}: their figures are outside "
        "what the checkpoint was trained on"
    )


def format_plan(plan: dict[str, Any]) -> str:
    """A per-device table of a PLAN.json dict."""
    from torchrec_dreamshard.device_report import device_table

    rows = [{**dev, "tables": len(dev["tables"])} for dev in plan["per_device"]]
    lines = device_table(rows, memory=True)
    lines.append(f"predicted step cost: {plan['predicted_cost_ms']:.3f} ms")
    return "\n".join(lines)


def check_plot_format(path: str | Path) -> None:
    """Refuse a plot file name whose suffix matplotlib cannot write (before planning)."""
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(path).suffix.lstrip(".").lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix and suffix not in formats:
        raise ValueError(
            f"--plot file {str(path)!r}: matplotlib cannot write {suffix!r} files; use one of "
            f"{sorted(formats)}"
        )


def plot_per_device(per_device: Sequence[dict[str, Any]], path: str | Path, title: str) -> None:
    """Stacked bars (forward, backward, communication) per device, written to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = [d["device"] for d in per_device]
    fwd = [d["fwd_ms"] for d in per_device]
    bwd = [d["bwd_ms"] for d in per_device]
    comm = [d["comm_ms"] for d in per_device]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.5 * len(devices) + 2), 4.0))
    ax.bar(devices, fwd, label="forward")
    ax.bar(devices, bwd, bottom=fwd, label="backward")
    ax.bar(devices, comm, bottom=[f + b for f, b in zip(fwd, bwd, strict=True)], label="comm")
    ax.set_xlabel("device")
    ax.set_ylabel("ms")
    ax.set_title(title)
    ax.set_xticks(devices)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
    fig.tight_layout()
    from torchrec_dreamshard.io import save_figure

    save_figure(fig, path, "plot file", dpi=120)
