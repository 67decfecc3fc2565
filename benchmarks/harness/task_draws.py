"""The tasks the benchmarks plan: draws of tables that training never saw.

* :func:`roster`: test draws of every task family (``data.families``), the tasks of the
  generalisation benchmark, the safety-net study and the plan regression;
* :func:`heldout_tasks`: test-split tasks of the DLRM-shaped pool, one per ``(T, D)``;
* :func:`bench_task`: the measurement benchmarks' one task.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from torchrec_dreamshard.data import families
from torchrec_dreamshard.data.sampler import TaskSampler
from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool
from torchrec_dreamshard.data.tasks import Task

PER_FAMILY = 3  # test tasks per family in the roster


def roster(
    names: Sequence[str] | None = None, per_family: int = PER_FAMILY, seed: int = 0
) -> list[tuple[str, Task]]:
    """``[(family, task)]``: ``per_family`` test draws of each family in ``names``
    (default: every family); the benchmarks plan task ``i`` with seed ``seed + i``."""
    names = list(families.FAMILIES) if names is None else list(names)
    return families.draw_tasks(names, per_family, "test", seed)


def heldout_tasks(
    shapes: Sequence[tuple[int, int]], seed: int = 0, memory_factor: float = 1.5
) -> list[Task]:
    """Tasks of the pool's *test* split (tables never seen in training), one per
    ``(num_tables, num_devices)`` in ``shapes``, batch 2048."""
    sampler = TaskSampler(synthetic_pool(scale=CPU_POOL_SCALE, seed=0), seed=0)
    rng = np.random.default_rng([seed, 2024])
    return [
        sampler.sample("test", t, d, batch_size=2048, memory_factor=memory_factor, rng=rng)
        for t, d in shapes
    ]


def bench_task(
    num_tables: int = 40, num_devices: int = 4, batch_size: int = 2048, seed: int = 0
) -> Task:
    """The measurement benchmarks' task: DLRM-shaped test tables at CPU scale."""
    pool = synthetic_pool(scale=CPU_POOL_SCALE, seed=seed)
    return TaskSampler(pool, seed=seed).sample("test", num_tables, num_devices, batch_size)
