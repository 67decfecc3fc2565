"""Shared helpers of the measurement benchmarks."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from torchrec_dreamshard.tasks import CPU_POOL_SCALE, TaskSampler, synthetic_pool

RESULTS = Path(__file__).resolve().parent / "results"
SHARED_NOTE = (
    "Taken on a shared 2-core development machine while other engineers ran tests and "
    "training on it; its speed drifts, so absolute figures carry that noise."
)


def bench_task(num_tables: int = 40, num_devices: int = 4, batch_size: int = 2048, seed: int = 0):
    """The benchmark task: DLRM-shaped tables at CPU scale."""
    pool = synthetic_pool(scale=CPU_POOL_SCALE, seed=seed)
    return TaskSampler(pool, seed=seed).sample("test", num_tables, num_devices, batch_size)


def machine() -> dict:
    from torchrec_dreamshard.measure import MeasureConfig, hardware_fingerprint

    return {
        **hardware_fingerprint(MeasureConfig()),
        "platform": platform.platform(),
        "load_average": os.getloadavg(),
        "torch_threads_default": torch.get_num_threads(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "note": SHARED_NOTE,
    }


def write(name: str, data: dict, summary: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    (RESULTS / f"{name}.md").write_text(summary.rstrip() + "\n")
    print(summary)
