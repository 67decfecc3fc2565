"""``measure_placement``: one entry point over both backends."""

from __future__ import annotations

import time
from collections.abc import Sequence

from torchrec_dreamshard.data.tasks import Task, check_placement
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.measurements import PlacementMeasurement

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
