"""Cost-network accuracy on held-out measured placements.

Held-out tasks (test-split tables, T and D beyond training), each with diverse placements
(random ones, the four heuristics, DreamShard's greedy plan). Every placement is measured
twice, in two interleaved passes (``measure_in_rounds``). Reported:

* MAPE of the predicted step cost against the first measurement, next to the MAPE between
  the two measurements (the measurement's own repeat-to-repeat error);
* Kendall tau between predicted and measured step cost across the placements of each task
  (mean over tasks), next to the tau between the two measurements.

Usage: python benchmarks/cost_model_accuracy.py [--checkpoint PATH] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _agent_common import heldout_tasks, machine, measure_fn, write  # noqa: E402

from torchrec_dreamshard import baselines  # noqa: E402
from torchrec_dreamshard.checkpoint import load_checkpoint  # noqa: E402
from torchrec_dreamshard.cost_fit import kendall_tau, mape  # noqa: E402
from torchrec_dreamshard.measure import measure_in_rounds  # noqa: E402

SHAPES = [(30, 2), (60, 4), (90, 8), (40, 8), (80, 2), (50, 4)]


def placements_for(agent, task, n_random: int) -> dict[str, list[int]]:
    out = {f"random{k}": baselines.place("random", task, seed=k) for k in range(n_random)}
    for name in baselines.HEURISTICS:
        out[name] = baselines.place(name, task)
    out["dreamshard"] = agent.place(task)
    unique: dict[str, list[int]] = {}
    for name, p in out.items():
        if p not in unique.values():
            unique[name] = p
    return unique


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=None, help="default: the bundled checkpoint")
    ap.add_argument("--quick", action="store_true", help="2 tasks, 2 random placements")
    args = ap.parse_args()
    agent = load_checkpoint(args.checkpoint)
    shapes = SHAPES[:2] if args.quick else SHAPES
    tasks = heldout_tasks(shapes, seed=1)
    measure = measure_fn()
    start = time.perf_counter()
    plans = [placements_for(agent, t, 2 if args.quick else 4) for t in tasks]
    passes = measure_in_rounds(  # two interleaved passes
        [list(p) for p in plans], lambda ti, name: measure(tasks[ti], plans[ti][name])[0], 2
    )
    measured = [{n: [r[n] for r in rs] for n in p} for p, rs in zip(plans, passes, strict=True)]
    rows, pred_all, meas1, meas2, taus, taus_repeat = [], [], [], [], [], []
    for ti, task in enumerate(tasks):
        names = list(plans[ti])
        pred = [agent.predict(task, plans[ti][n]).step_ms for n in names]
        m1 = [measured[ti][n][0] for n in names]
        m2 = [measured[ti][n][1] for n in names]
        tau, tau_rep = kendall_tau(pred, m1), kendall_tau(m1, m2)
        taus.append(tau)
        taus_repeat.append(tau_rep)
        pred_all += pred
        meas1 += m1
        meas2 += m2
        rows.append(
            {
                "tables": len(task.tables),
                "devices": task.num_devices,
                "placements": names,
                "predicted_ms": pred,
                "measured_ms": [m1, m2],
                "mape": mape(pred, m1),
                "repeat_mape": mape(m2, m1),
                "kendall_tau": tau,
                "repeat_kendall_tau": tau_rep,
            }
        )
    result = {
        "checkpoint": args.checkpoint or "bundled",
        "agent_meta": {k: agent.meta.get(k) for k in ("measurements", "train_wall_s", "pool")},
        "tasks": rows,
        "step_mape": mape(pred_all, meas1),
        "repeat_mape": mape(meas2, meas1),
        "kendall_tau": float(np.mean(taus)),
        "repeat_kendall_tau": float(np.mean(taus_repeat)),
        "placements": len(pred_all),
        "wall_s": time.perf_counter() - start,
        "machine": machine(),
    }
    lines = [
        "# Cost-network accuracy on held-out placements",
        "",
        f"{len(tasks)} held-out tasks (test-split tables; T, D in {shapes}), "
        f"{len(pred_all)} placements (random, the four heuristics, DreamShard greedy), each "
        "measured twice in interleaved passes (batch 2048, row-wise Adagrad, CPU kernels).",
        "",
        "| task (T, D) | MAPE % | repeat MAPE % | Kendall tau | repeat tau |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| ({r['tables']}, {r['devices']}) | {r['mape']:.1f} | {r['repeat_mape']:.1f} | "
            f"{r['kendall_tau']:.2f} | {r['repeat_kendall_tau']:.2f} |"
        )
    lines += [
        f"| **all** | **{result['step_mape']:.1f}** | **{result['repeat_mape']:.1f}** | "
        f"**{result['kendall_tau']:.2f}** | **{result['repeat_kendall_tau']:.2f}** |",
        "",
        "Targets: MAPE no larger than the repeat MAPE; Kendall tau >= 0.8.",
        f"Wall time {result['wall_s']:.0f} s. {machine()['note']}",
        "Raw: cost_model_accuracy.json. Script: benchmarks/cost_model_accuracy.py.",
    ]
    write("cost_model_accuracy", result, "\n".join(lines))


if __name__ == "__main__":
    main()
