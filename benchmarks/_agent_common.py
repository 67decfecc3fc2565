"""Shared helpers of the DreamShard agent benchmarks (placement quality, cost-model
accuracy, training cost, generalisation, splits)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from _common import RESULTS, machine, write  # noqa: F401 (re-exported)

from torchrec_dreamshard.data.sampler import TaskSampler
from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool
from torchrec_dreamshard.data.tasks import Task


def heldout_tasks(
    shapes: Sequence[tuple[int, int]], seed: int = 0, memory_factor: float = 1.5
) -> list[Task]:
    """Tasks of the pool's *test* split (tables never seen in training), one per
    ``(num_tables, num_devices)``."""
    sampler = TaskSampler(synthetic_pool(scale=CPU_POOL_SCALE, seed=0), seed=0)
    rng = np.random.default_rng([seed, 2024])
    return [
        sampler.sample("test", t, d, batch_size=2048, memory_factor=memory_factor, rng=rng)
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


def measure_costs(task: Task, placement: Sequence[int], config) -> dict:
    """One measurement of ``placement`` on real kernels: ``dev``, each device's
    ``[fwd, bwd, comm]`` ms; ``compute``, the slowest device's fwd + bwd; ``step``, its
    fwd + bwd + comm."""
    from torchrec_dreamshard.measure import measure_placement

    m = measure_placement(task, list(placement), config)
    if not m.ok:
        raise RuntimeError(f"measurement failed: {m.error}")
    dev = [[d.fwd_ms, d.bwd_ms, d.comm_ms] for d in m.per_device]
    return {
        "compute": max(f + b for f, b, _ in dev),
        "step": max(f + b + c for f, b, c in dev),
        "dev": dev,
    }


def single_ms(spec, batch_size: int, config) -> float:
    """Table ``spec`` alone on one device: measured fwd + bwd (ms)."""
    from torchrec_dreamshard.measure import time_fused_kernel

    return float(sum(time_fused_kernel([spec], batch_size, config)))


def geomean(values: Sequence[float]) -> float:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return float(math.exp(np.mean(np.log(vals)))) if vals else float("nan")
