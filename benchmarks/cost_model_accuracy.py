"""Cost-network accuracy on held-out measured placements.

Held-out tasks (test-split tables, T and D beyond training), each with diverse placements
(random ones, the four heuristics, DreamShard's default plan). Every placement is measured
twice, in two interleaved passes (``measure_in_rounds``). Reported:

* MAPE of the predicted step cost against the first measurement, next to the MAPE between
  the two measurements (the measurement's own repeat-to-repeat error);
* Kendall tau between predicted and measured step cost across the placements of each task
  (mean over tasks), next to the tau between the two measurements.

Usage: python benchmarks/cost_model_accuracy.py [--checkpoint PATH] [--quick]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from torchrec_dreamshard.cost.fitting import kendall_tau, mape
from torchrec_dreamshard.evaluation.placers import place
from torchrec_dreamshard.measure import measure_in_rounds
from torchrec_dreamshard.planner.stages.candidates import default_sources
from torchrec_dreamshard.policy.checkpoint import load_checkpoint
from torchrec_dreamshard.policy.heuristics import HEURISTICS

from harness.plan_measuring import measure_fn
from harness.results_files import machine, write
from harness.task_draws import heldout_tasks

SHAPES = [(30, 2), (60, 4), (90, 8), (40, 8), (80, 2), (50, 4)]


def placements_for(agent, task, n_random: int) -> dict[str, list[int]]:
    out = {f"random{k}": place("random", task, seed=k) for k in range(n_random)}
    for name in HEURISTICS:
        out[name] = place(name, task)
    out["dreamshard"] = agent.place(task)
    unique: dict[str, list[int]] = {}
    for name, p in out.items():
        if p not in unique.values():
            unique[name] = p
    return unique


def task_row(agent, task, plans: dict, measured: list[dict]) -> dict:
    """One task's predictions against its two measured passes."""
    names = list(plans)
    pred = [agent.predict(task, plans[n]).step_ms for n in names]
    m1, m2 = ([m[n] for n in names] for m in measured)
    return {
        "tables": len(task.tables),
        "devices": task.num_devices,
        "placements": names,
        "predicted_ms": pred,
        "measured_ms": [m1, m2],
        "mape": mape(pred, m1),
        "repeat_mape": mape(m2, m1),
        "kendall_tau": kendall_tau(pred, m1),
        "repeat_kendall_tau": kendall_tau(m1, m2),
    }


def overall(rows: list[dict]) -> dict:
    """MAPE over every placement, mean tau over the tasks, each beside its repeat figure."""
    pred = [x for r in rows for x in r["predicted_ms"]]
    meas1 = [x for r in rows for x in r["measured_ms"][0]]
    meas2 = [x for r in rows for x in r["measured_ms"][1]]
    return {
        "step_mape": mape(pred, meas1),
        "repeat_mape": mape(meas2, meas1),
        "kendall_tau": float(np.mean([r["kendall_tau"] for r in rows])),
        "repeat_kendall_tau": float(np.mean([r["repeat_kendall_tau"] for r in rows])),
        "placements": len(pred),
    }


def report(result: dict, shapes) -> str:
    lines = [
        "# Cost-network accuracy on held-out placements",
        "",
        f"{len(result['tasks'])} held-out tasks (test-split tables; T, D in {shapes}), "
        f"{result['placements']} placements (random, the four heuristics, DreamShard's default "
        "plan), each measured twice in interleaved passes (batch 2048, row-wise Adagrad, CPU "
        "kernels).",
        "",
        "| task (T, D) | MAPE % | repeat MAPE % | Kendall tau | repeat tau |",
        "|---|---|---|---|---|",
    ]
    for r in result["tasks"]:
        lines.append(
            f"| ({r['tables']}, {r['devices']}) | {r['mape']:.1f} | {r['repeat_mape']:.1f} | "
            f"{r['kendall_tau']:.2f} | {r['repeat_kendall_tau']:.2f} |"
        )
    lines += [
        f"| **all** | **{result['step_mape']:.1f}** | **{result['repeat_mape']:.1f}** | "
        f"**{result['kendall_tau']:.2f}** | **{result['repeat_kendall_tau']:.2f}** |",
        "",
        "Targets: MAPE no larger than the repeat MAPE; Kendall tau >= 0.8.",
        f"Wall time {result['wall_s']:.0f} s. {result['machine']['note']}",
        "Raw: cost_model_accuracy.json. Script: benchmarks/cost_model_accuracy.py.",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=None, help="default: the bundled checkpoint")
    ap.add_argument("--quick", action="store_true", help="2 tasks, 2 random placements")
    args = ap.parse_args()
    agent = load_checkpoint(args.checkpoint, sources=default_sources())
    shapes = SHAPES[:2] if args.quick else SHAPES
    tasks = heldout_tasks(shapes, seed=1)
    measure = measure_fn()
    start = time.perf_counter()
    plans = [placements_for(agent, t, 2 if args.quick else 4) for t in tasks]
    passes = measure_in_rounds(  # two interleaved passes
        [list(p) for p in plans], lambda ti, name: measure(tasks[ti], plans[ti][name])[0], 2
    )
    rows = [task_row(agent, *x) for x in zip(tasks, plans, passes, strict=True)]
    result = {
        "checkpoint": args.checkpoint or "bundled",
        "agent_meta": {k: agent.meta.get(k) for k in ("measurements", "train_wall_s", "pool")},
        "tasks": rows,
        **overall(rows),
        "wall_s": time.perf_counter() - start,
        "machine": machine(),
    }
    write("cost_model_accuracy", result, report(result, shapes))


if __name__ == "__main__":
    main()
