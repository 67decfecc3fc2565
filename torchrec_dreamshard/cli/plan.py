"""``dreamshard plan``: place a task's tables with a trained DreamShard agent."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXAMPLES = """examples:
  dreamshard plan task.json
  dreamshard plan task.json --out plan.json --plot plan.png
  dreamshard plan task.json --checkpoint my_gpus.pt --mode search --num-samples 32

TASK.json: {"num_devices": 4, "memory_bytes": 17179869184, "batch_size": 2048,
            "tables": [{"name": "t0", "rows": 100000, "dim": 64, "pooling_factor": 12.5}]}
(batch_size is the global batch; memory_bytes one number or one per device).
Without --checkpoint the checkpoint bundled with the package is used.
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
    p.add_argument("--mode", choices=["greedy", "search"], default="greedy")
    p.add_argument("--num-samples", type=int, default=16, help="roll-outs in search mode")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torchrec_dreamshard.checkpoint import load_checkpoint
    from torchrec_dreamshard.tasks import Task

    task = Task.load(args.task)
    agent = load_checkpoint(args.checkpoint)
    start = time.perf_counter()
    placement = agent.place(task, mode=args.mode, num_samples=args.num_samples, seed=args.seed)
    seconds = time.perf_counter() - start
    plan = plan_dict(task, placement, agent.predict(task, placement))
    print(
        f"placed {len(task.tables)} tables on {task.num_devices} devices in {seconds:.3f}s "
        f"({args.mode}, checkpoint: {args.checkpoint or 'bundled'})"
    )
    print(format_plan(plan))
    if args.out:
        Path(args.out).write_text(json.dumps(plan, indent=1) + "\n")
        print(f"wrote {args.out}")
    if args.plot:
        plot_per_device(plan["per_device"], args.plot, f"{Path(args.task).name}: predicted")
        print(f"wrote {args.plot}")
    return 0


def plan_dict(task: Any, placement: Sequence[int], prediction: Any) -> dict[str, Any]:
    """The PLAN.json contents: placement by table name, predicted step cost (ms) and
    each device's tables, bytes and predicted forward/backward/communication ms."""
    from torchrec_dreamshard.tasks import device_bytes, device_tables, placement_to_dict

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


def format_plan(plan: dict[str, Any]) -> str:
    """A per-device table of a PLAN.json dict."""
    from torchrec_dreamshard.report import device_table

    rows = [{**dev, "tables": len(dev["tables"])} for dev in plan["per_device"]]
    lines = device_table(rows, memory=True)
    lines.append(f"predicted step cost: {plan['predicted_cost_ms']:.3f} ms")
    return "\n".join(lines)


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
    fig.savefig(path, dpi=120)
    plt.close(fig)
