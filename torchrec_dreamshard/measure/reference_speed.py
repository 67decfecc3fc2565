"""This machine's time on the reference kernel, measured (once per machine: the cache file
is :mod:`torchrec_dreamshard.cache.reference_time`'s).

A cost network trained on another machine prices fused kernels in that machine's time:
the bundled one was trained on an AMD EPYC, and on an Intel Xeon its prediction of the
reference kernel's backward is 16 times too short. Where the planner sets such prices
beside costs measured here (the dense kernel of data-parallel tables, the collectives),
it brings them to this machine's time by the ratio of the reference kernel
(:data:`~torchrec_dreamshard.measure.embedding_kernels.REFERENCE_TABLES` at batch
:data:`~torchrec_dreamshard.measure.embedding_kernels.REFERENCE_BATCH_SIZE`, row-wise Adagrad) as
measured here to the network's prediction of it, forward and backward apart
(:func:`speed_ratio`). One kernel cannot say how every table's time moves between two
machines; calibration (``calibrate=``) measures the user's own tables and is the better
fix where it is affordable.
"""

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
from torchrec_dreamshard.ranks.job_group import (
    JobGroup,
    active_group,
    group_task,
)


@spent_on("reference_kernel")
def measure_reference_ms(device: str = "cpu") -> tuple[float, float]:
    """``(fwd_ms, bwd_ms)`` of the reference kernel on this machine (a second or two);
    while rank 0 of a job drives measurements on its group, the median over its ranks,
    each timing it on its own device."""
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
    """``(fwd, bwd)`` factors that bring a prediction to this machine's time: measured
    over predicted (1 where the prediction is not positive)."""
    return tuple(m / p if p > 0 else 1.0 for m, p in zip(measured, predicted, strict=True))
