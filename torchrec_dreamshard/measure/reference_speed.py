"""This machine's time on the reference kernel, and :func:`speed_ratio`, which brings a cost
network trained on another machine to this machine's time."""

from __future__ import annotations

import statistics

from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.embedding_kernels import (
    REFERENCE_BATCH_SIZE,
    REFERENCE_TABLES,
    time_fused_kernel,
)
from torchrec_dreamshard.measure.gate import check_may_measure
from torchrec_dreamshard.measure.group_tasks import run_on_group
from torchrec_dreamshard.measure.spent import spent_on
from torchrec_dreamshard.ranks.job_group import JobGroup, active_group, group_task


@spent_on("reference_kernel")
def measure_reference_ms(device: str = "cpu") -> tuple[float, float]:
    """``(fwd_ms, bwd_ms)`` of the reference kernel here (the median over a driven job's ranks)."""
    check_may_measure("measure_reference_ms")
    if active_group() is not None:
        times = run_on_group(_group_reference_ms)
        return statistics.median(f for f, _ in times), statistics.median(b for _, b in times)
    return _time_reference(device)


def _time_reference(device: str) -> tuple[float, float]:
    config = MeasureConfig(device=device, rounds=3, iters=5)
    return time_fused_kernel(list(REFERENCE_TABLES), REFERENCE_BATCH_SIZE, config)


@group_task
def _group_reference_ms(group: JobGroup) -> tuple[float, float]:
    return _time_reference("cuda" if group.device.type == "cuda" else "cpu")


def speed_ratio(
    measured: tuple[float, float], predicted: tuple[float, float]
) -> tuple[float, float]:
    """``(fwd, bwd)`` measured over predicted (1 where the prediction is not positive)."""
    return tuple(m / p if p > 0 else 1.0 for m, p in zip(measured, predicted, strict=True))
