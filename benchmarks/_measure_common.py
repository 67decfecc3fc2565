"""Shared helpers of the measurement benchmarks."""

from __future__ import annotations

from _common import RESULTS, machine, write  # noqa: F401 (re-exported)

from torchrec_dreamshard.data.sampler import TaskSampler
from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool


def bench_task(num_tables: int = 40, num_devices: int = 4, batch_size: int = 2048, seed: int = 0):
    """The benchmark task: DLRM-shaped tables at CPU scale."""
    pool = synthetic_pool(scale=CPU_POOL_SCALE, seed=seed)
    return TaskSampler(pool, seed=seed).sample("test", num_tables, num_devices, batch_size)
