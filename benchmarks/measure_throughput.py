"""Placements measured per minute: a 40-table, 4-device task at batch 2048, both backends.

Run: .venv/bin/python benchmarks/measure_throughput.py
"""

from __future__ import annotations

import statistics
import time

from torchrec_dreamshard.cost.collective_models import load_all_to_all_model, local_all_to_all
from torchrec_dreamshard.data.tasks import random_placement
from torchrec_dreamshard.measure import MeasureConfig, measure_placement
from torchrec_dreamshard.measure.distributed import close_pools

from harness.results_files import machine, write
from harness.task_draws import bench_task


def run_backend(task, backend: str, n: int, config: MeasureConfig) -> dict:
    walls, steps = [], []
    comm = local_all_to_all(task.num_devices, backend, config.comm_model_path)
    for i in range(n):
        placement = random_placement(task, i)
        t0 = time.perf_counter()
        m = measure_placement(task, placement, config, backend=backend, comm=comm)
        walls.append(time.perf_counter() - t0)
        steps.append(m.step_ms if m.ok else None)
        print(f"{backend} {i}: {walls[-1]:.2f} s, step {m.step_ms:.1f} ms", flush=True)
    steady = walls[1:]
    return {
        "wall_s": walls,
        "step_ms": steps,
        "first_s": walls[0],
        "steady_median_s": statistics.median(steady),
        "steady_placements_per_min": 60 / statistics.median(steady),
    }


def _row(name: str, r: dict) -> str:
    return (
        f"| {name} | {r['first_s']:.2f} | {r['steady_median_s']:.2f} | "
        f"{r['steady_placements_per_min']:.0f} |"
    )


def main() -> None:
    task = bench_task()
    config = MeasureConfig()
    load_all_to_all_model()  # calibrated once per machine, not part of a placement's cost
    out = {
        "machine": machine(),
        "config": config.to_dict(),
        "task_tables": len(task.tables),
        "task_devices": task.num_devices,
        "batch_size": task.batch_size,
        "backends": {},
    }
    out["backends"]["local"] = run_backend(task, "local", 10, config)
    out["backends"]["distributed"] = run_backend(task, "distributed", 8, config)
    close_pools()
    lo, di = out["backends"]["local"], out["backends"]["distributed"]
    summary = f"""# Measurement throughput

40 DLRM-shaped tables (CPU scale), 4 devices, batch 2048, row-wise Adagrad, default protocol
(warmup {config.warmup}, {config.iters} iterations x {config.rounds} rounds, reference kernel
beside every round). "first" includes generating the task's batches (and, for distributed,
spawning the 4 gloo ranks); later placements of the same task reuse batches and ranks.

| backend | first placement (s) | steady s/placement (median) | placements/min |
|---|---|---|---|
{_row("local", lo)}
{_row("distributed (4 gloo ranks)", di)}

Target: under 2 s per placement with local. {out["machine"]["note"]}
Raw: measure_throughput.json. Script: benchmarks/measure_throughput.py.
"""
    write("measure_throughput", out, summary)


if __name__ == "__main__":
    main()
