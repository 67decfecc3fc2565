"""The local backend: one process times each device's fused kernel in turn (one thread per
device on CPU) and charges the all-to-all from a model."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task, device_tables
from torchrec_dreamshard.measure.comm import AllToAllCost
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.device_sets import DeviceSetTimes
from torchrec_dreamshard.measure.embedding_kernels import (
    ARENA,
    FusedKernel,
    reference_kernel,
    reference_numel,
    state_numel,
    time_kernels,
)
from torchrec_dreamshard.measure.measurements import PlacementMeasurement
from torchrec_dreamshard.measure.summary import summarise
from torchrec_dreamshard.threads import single_thread


def measure_local(
    task: Task,
    placement: Sequence[int],
    config: MeasureConfig,
    comm: AllToAllCost | None,
    shared: DeviceSetTimes | None = None,
) -> PlacementMeasurement:
    """Measure a checked placement in one process: every device's kernel and the reference
    kernel in interleaved rounds; ``shared`` device sets are timed once a round.

    Raises:
        ValueError: more than one device and no ``comm``.
    """
    check_comm(task, comm)
    start = time.perf_counter()
    groups = [[task.tables[i] for i in idx] for idx in device_tables(task, placement)]
    if shared is None:
        compute = time_groups(groups, task.batch_size, config)
    else:
        compute = shared.compute(
            task, placement, config.rounds, lambda g: time_groups(g, task.batch_size, config)
        )
    dims = [sum(t.dim for t in g) for g in groups]
    if comm is not None and task.num_devices > 1:
        comm_row = comm.device_comm_ms(dims, task.batch_size)
        source = f"model: {comm.source}"
    else:
        comm_row, source = [0.0], "none (one device)"
    comm_ms = np.tile(np.asarray(comm_row, dtype=np.float64), (config.rounds, 1))
    return summarise(
        compute[:, :-1],
        comm_ms,
        compute[:, -1].sum(axis=1),
        [len(g) for g in groups],
        "local",
        source,
        time.perf_counter() - start,
    )


def check_comm(task: Task, comm: AllToAllCost | None) -> None:
    """Refuse a local measurement of several devices without an all-to-all model."""
    if comm is None and task.num_devices > 1:
        raise ValueError(
            f"the local backend charges the all-to-all of {task.num_devices} devices from a "
            "model: pass comm= (the machine's: torchrec_dreamshard.cost.collective_models"
            ".load_all_to_all_model())"
        )


def time_groups(
    groups: list[list[TableSpec]], batch_size: int, config: MeasureConfig
) -> np.ndarray:
    """Time one fused kernel per group of tables, and the reference kernel, in rounds.

    Returns:
        ``[rounds, len(groups) + 1, 2]`` round medians of ``(fwd_ms, bwd_ms)``; the last
        column is the reference kernel, zeros for an empty group.
    """
    with single_thread(config.device == "cpu"):
        if config.device == "cpu":
            need = sum(sum(state_numel(g, config.optimizer)) for g in groups)
            ARENA.reserve(need + reference_numel(config))
        kernels = [FusedKernel(g, batch_size, config, ARENA) if g else None for g in groups]
        kernels.append(reference_kernel(config, ARENA))
        try:
            return time_kernels(kernels, config)
        finally:
            del kernels
