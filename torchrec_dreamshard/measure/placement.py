"""``measure_placement``: one entry point over both backends."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.types import PlacementMeasurement
from torchrec_dreamshard.tasks import Task, check_placement

BACKENDS = ("local", "distributed")


def measure_placement(
    task: Task,
    placement: Sequence[int],
    config: MeasureConfig | None = None,
    backend: str = "local",
) -> PlacementMeasurement:
    """Measure a placement on real fused kernels and a real (or modelled) all-to-all.

    Args:
        task: the tables, devices, memory and batch size.
        placement: a device per table, in the task's table order.
        config: optimizer, precision, device and timing protocol (default
            :class:`MeasureConfig`).
        backend: ``"local"`` (one process times each device in turn; communication from the
            fitted model) or ``"distributed"`` (one gloo/NCCL rank per device).

    Returns:
        The measurement. An out-of-memory or kernel error gives ``ok=False`` with the error,
        so that a collection can record it and go on.

    Raises:
        ValueError: a bad backend, or a placement that does not fit (refused before any
            kernel runs, naming the device and its tables).
    """
    config = config or MeasureConfig()
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    placement = check_placement(task, placement)
    start = time.perf_counter()
    try:
        if backend == "local":
            from torchrec_dreamshard.measure.local import measure_local

            return measure_local(task, placement, config)
        from torchrec_dreamshard.measure.distributed import measure_distributed

        return measure_distributed(task, placement, config)
    except (RuntimeError, MemoryError) as exc:  # OOM and kernel errors are data, not crashes
        return PlacementMeasurement.failed(
            f"{type(exc).__name__}: {exc}", backend, time.perf_counter() - start
        )


def random_placement(task: Task, seed: int | np.random.Generator = 0) -> list[int]:
    """A uniformly random device for each table among those with room left (tables taken
    largest first, so that a feasible placement is found whenever greedy finds one).

    Raises:
        ValueError: some table fits on no device.
    """
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    free = list(task.memory)
    placement = [0] * len(task.tables)
    order = sorted(range(len(task.tables)), key=lambda i: -task.tables[i].size_bytes)
    for i in order:
        size = task.tables[i].size_bytes
        legal = [d for d in range(task.num_devices) if free[d] >= size]
        if not legal:
            raise ValueError(
                f"table {task.tables[i].name!r} ({size} bytes) fits on no device: the devices "
                f"have {free} bytes left"
            )
        d = int(rng.choice(legal))
        placement[i] = d
        free[d] -= size
    return placement
