"""Repeatability: one placement measured 10 times; max/min of the step cost, raw and
normalised by the reference kernel timed beside it.

Run: .venv/bin/python benchmarks/measure_repeatability.py
"""

from __future__ import annotations

import statistics

from torchrec_dreamshard.cost.collective_models import local_all_to_all
from torchrec_dreamshard.data.tasks import random_placement
from torchrec_dreamshard.measure import MeasureConfig, measure_placement
from torchrec_dreamshard.measure.distributed import close_pools

from harness.results_files import machine, write
from harness.task_draws import bench_task

REPEATS = 10


def repeat(task, placement, backend: str, config: MeasureConfig) -> dict:
    raw, norm, ref, round_norm = [], [], [], []
    comm = local_all_to_all(task.num_devices, backend, config.comm_model_path)
    for i in range(REPEATS):
        m = measure_placement(task, placement, config, backend=backend, comm=comm)
        raw.append(m.step_ms)
        ref.append(m.reference_ms)
        norm.append(m.normalised_step)
        ratios = [
            s / r
            for s, r in zip(m.extra["round_step_ms"], m.extra["round_reference_ms"], strict=True)
        ]
        round_norm.append(statistics.median(ratios))
        print(
            f"{backend} {i}: step {m.step_ms:.2f} ms, reference {m.reference_ms:.2f} ms", flush=True
        )
    return {
        "step_ms": raw,
        "reference_ms": ref,
        "normalised_step": norm,
        "normalised_step_round_median": round_norm,
        "max_over_min_raw": max(raw) / min(raw),
        "max_over_min_normalised": max(norm) / min(norm),
        "max_over_min_round_normalised": max(round_norm) / min(round_norm),
        "max_over_min_reference": max(ref) / min(ref),
    }


def main() -> None:
    task = bench_task()
    placement = random_placement(task, 0)
    config = MeasureConfig()
    out = {
        "machine": machine(),
        "config": config.to_dict(),
        "placement": placement,
        "repeats": REPEATS,
        "backends": {},
    }
    for backend in ("local", "distributed"):
        out["backends"][backend] = repeat(task, placement, backend, config)
    close_pools()
    rows = "\n".join(
        f"| {b} | {r['max_over_min_raw']:.3f} | {r['max_over_min_normalised']:.3f} | "
        f"{r['max_over_min_round_normalised']:.3f} | {r['max_over_min_reference']:.3f} |"
        for b, r in out["backends"].items()
    )
    summary = f"""# Measurement repeatability

One placement of a 40-table, 4-device task (batch 2048, row-wise Adagrad) measured
{REPEATS} times with the default protocol (minimum over {config.rounds} rounds of the median of
{config.iters} iterations, devices and the reference kernel interleaved). Max/min over the
repeats of: the raw step cost; the step cost divided by the reference kernel's time (min of
round medians); the median over rounds of the per-round step / per-round reference; and
the reference kernel itself (the machine's drift).

| backend | raw | normalised | normalised per round | reference |
|---|---|---|---|---|
{rows}

Target: within 5% (1.05). {out["machine"]["note"]}
Raw: measure_repeatability.json. Script: benchmarks/measure_repeatability.py.
"""
    write("measure_repeatability", out, summary)


if __name__ == "__main__":
    main()
