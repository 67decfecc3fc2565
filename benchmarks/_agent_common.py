"""Shared helpers of the DreamShard agent benchmarks (placement quality, cost-model
accuracy, training cost)."""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from torchrec_dreamshard.tasks import CPU_POOL_SCALE, Task, TaskSampler, synthetic_pool

RESULTS = Path(__file__).resolve().parent / "results"
NOTE = (
    "Taken on a shared 2-core development machine while other engineers ran tests, "
    "measurements and training on it; its speed drifts (the measurement repeatability "
    "benchmark finds up to ~1.4x between repeats), so plans are compared in interleaved "
    "rounds and the spread over rounds is reported."
)


def heldout_tasks(
    shapes: Sequence[tuple[int, int]], seed: int = 0, memory_factor: float = 1.5
) -> list[Task]:
    """Tasks of the pool's *test* split (tables never seen in training), one per
    ``(num_tables, num_devices)``."""
    sampler = TaskSampler(synthetic_pool(scale=CPU_POOL_SCALE, seed=0), seed=0)
    sampler.rng = np.random.default_rng([seed, 2024])
    return [
        sampler.sample("test", t, d, batch_size=2048, memory_factor=memory_factor)
        for t, d in shapes
    ]


def measure_fn(config=None):
    """``(task, placement) -> (step_ms, per-device totals, reference_ms)`` on real kernels."""
    from torchrec_dreamshard.measure import MeasureConfig, measure_placement

    config = config or MeasureConfig()

    def measure(task: Task, placement: Sequence[int]):
        m = measure_placement(task, list(placement), config)
        if not m.ok:
            raise RuntimeError(f"measurement failed: {m.error}")
        return m.step_ms, [d.total_ms for d in m.per_device], m.reference_ms

    return measure


def geomean(values: Sequence[float]) -> float:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return float(math.exp(np.mean(np.log(vals)))) if vals else float("nan")


def machine() -> dict:
    from torchrec_dreamshard.measure import MeasureConfig, hardware_fingerprint

    return {
        **hardware_fingerprint(MeasureConfig()),
        "platform": platform.platform(),
        "load_average": os.getloadavg(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "note": NOTE,
    }


def write(name: str, data: dict, summary: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    (RESULTS / f"{name}.md").write_text(summary.rstrip() + "\n")
    print(summary)
