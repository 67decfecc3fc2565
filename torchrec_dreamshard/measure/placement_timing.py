"""``measure_placement`` over both backends, and ``measure_plans``: one task's named
placements against each other in interleaved rounds."""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

from torchrec_dreamshard.data.tasks import Task, check_placement
from torchrec_dreamshard.measure.comm import AllToAllCost
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.device_sets import DeviceSetTimes
from torchrec_dreamshard.measure.gate import check_may_measure
from torchrec_dreamshard.measure.local import check_comm, measure_local
from torchrec_dreamshard.measure.measurements import PlacementMeasurement
from torchrec_dreamshard.measure.rounds import measure_in_rounds

BACKENDS = ("local", "distributed")
K = TypeVar("K", bound=Hashable)


def measure_placement(
    task: Task,
    placement: Sequence[int],
    config: MeasureConfig | None = None,
    backend: str = "local",
    comm: AllToAllCost | None = None,
    shared: DeviceSetTimes | None = None,
) -> PlacementMeasurement:
    """Measure a placement on real fused kernels and a real (or modelled) all-to-all.

    Args:
        placement: a device per table, in the task's table order.
        backend: ``"local"`` (one process times each device in turn) or ``"distributed"``
            (one gloo/NCCL rank per device).
        comm: the all-to-all model the local backend charges over several devices
            (:func:`~torchrec_dreamshard.cost.collective_models.load_all_to_all_model`).
        shared: local backend only: one round's :class:`~.device_sets.DeviceSetTimes`.

    Returns:
        The measurement; an out-of-memory or kernel error gives ``ok=False`` with the error.

    Raises:
        ValueError: a bad backend, a placement that does not fit, the local backend over
            several devices without ``comm``, or ``shared`` with the distributed backend.

    Example::

        comm = load_all_to_all_model()
        m = measure_placement(task, random_placement(task, seed=0), comm=comm)
        print(m.step_ms, m.per_device[0].fwd_ms)
    """
    check_may_measure("measure_placement")
    config = config or MeasureConfig()
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    placement = check_placement(task, placement)
    if backend == "local":
        check_comm(task, comm)
    elif shared is not None:
        raise ValueError("shared device-set timings are the local backend's, not the distributed")
    start = time.perf_counter()
    try:
        if backend == "local":
            return measure_local(task, placement, config, comm, shared)
        # imported when used: importing it registers the rank pools' exit hook
        from torchrec_dreamshard.measure.distributed import measure_distributed

        return measure_distributed(task, placement, config)
    except (RuntimeError, MemoryError) as exc:  # OOM and kernel errors are data, not crashes
        return PlacementMeasurement.failed(
            f"{type(exc).__name__}: {exc}", backend, time.perf_counter() - start
        )


def measure_plans(
    task: Task,
    plans: Mapping[K, Sequence[int]],
    config: MeasureConfig | None = None,
    rounds: int = 3,
    backend: str = "local",
    done: Sequence[Mapping[K, PlacementMeasurement]] = (),
    comm: AllToAllCost | None = None,
) -> list[dict[K, PlacementMeasurement]]:
    """Every named placement of ``task`` measured once per round (:func:`measure_in_rounds`).

    Args:
        plans: a placement by name, measured in this order in round 0.
        rounds: rounds in all, ``done``'s included.
        done: this task's rounds already measured.

    Returns:
        The rounds, each ``{name: measurement}``.

    Raises:
        RuntimeError: a measurement failed (the plan and its error are named).
    """

    def measure(_: int, name: K) -> PlacementMeasurement:
        m = measure_placement(task, list(plans[name]), config, backend, comm)
        if not m.ok:
            raise RuntimeError(f"measuring plan {name!r} failed: {m.error}")
        return m

    return measure_in_rounds([list(plans)], measure, rounds, done=[list(done)])[0]
