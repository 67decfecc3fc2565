"""What verification measures with (:class:`Timing`, :func:`kernel_timing`), guarded: a
measurement that fails raises :class:`MeasuringFailed`, which ends the verification."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from torchrec_dreamshard.cost.collective_models import local_all_to_all
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure import placement_timing
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.device_sets import DeviceSetTimes
from torchrec_dreamshard.measure.guard import MeasureFailure, guarded
from torchrec_dreamshard.verification.noise import reference_ms

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.verification.verify_result import VerifiedPlan


@dataclass(frozen=True)
class Timing:
    """What :func:`~.verification.verify` measures with.

    Attributes:
        step_ms: ``(task, placement) -> ms``, one measured step of a plan.
        reference_ms: the reference kernel now (``None``: not timed).
        clock: the seconds its budget is kept by (tests pass their own).
        shared_step_ms: ``step_ms`` sharing a round's timed device sets (``None``: none).
    """

    step_ms: Callable[[Task, list[int]], float]
    reference_ms: Callable[[], float] | None = None
    clock: Callable[[], float] = time.perf_counter
    shared_step_ms: Callable[[Task, list[int], DeviceSetTimes], float] | None = None


def kernel_timing(config: MeasureConfig) -> Timing:
    """Real FBGEMM kernels with ``config`` and the machine's all-to-all model, and the reference."""

    def shared_step_ms(task: Task, placement: list[int], shared: DeviceSetTimes | None) -> float:
        comm = local_all_to_all(task.num_devices, path=config.comm_model_path)
        m = placement_timing.measure_placement(task, placement, config, comm=comm, shared=shared)
        if not m.ok:
            raise RuntimeError(str(m.error))
        return float(m.step_ms)

    def step_ms(task: Task, placement: list[int]) -> float:
        return shared_step_ms(task, placement, None)

    return Timing(step_ms, partial(reference_ms, config), shared_step_ms=shared_step_ms)


def _or_raise(what: str, measure: Callable[[], float], device: str) -> float:
    """``measure()`` guarded: a failure raises :class:`MeasuringFailed`."""
    ms = guarded(what, measure, device=device, warn=False)
    if isinstance(ms, MeasureFailure):
        raise MeasuringFailed(ms)
    return ms


def guarded_step(
    step_ms: Callable[[Task, list[int]], float], plans: Sequence[VerifiedPlan], device: str
) -> Callable[[Task, list[int]], float]:
    """``step_ms`` guarded: a failed measurement raises :class:`MeasuringFailed` naming the plan."""
    names = {tuple(p.placement): p.name for p in plans}

    def step(task: Task, placement: list[int]) -> float:
        name = names.get(tuple(placement), "a plan")
        measure = partial(checked_step, step_ms, task, placement)
        return _or_raise(f"verification: measuring plan {name}", measure, device)

    return step


def checked_step(
    step_ms: Callable[[Task, list[int]], float], task: Task, placement: list[int]
) -> float:
    """``step_ms`` of the plan; a time not finite and non-negative raises ``RuntimeError``."""
    ms = float(step_ms(task, placement))
    if not (math.isfinite(ms) and ms >= 0):
        raise RuntimeError(f"the timer gave {ms} ms for one step")
    return ms


def guarded_reference(reference_ms: Callable[[], float], device: str) -> Callable[[], float]:
    """``reference_ms`` guarded: a timing that fails raises :class:`MeasuringFailed`."""
    return partial(_or_raise, "verification: the reference kernel", reference_ms, device)


class MeasuringFailed(Exception):
    """A measurement of the verification failed on this machine (its record attached)."""

    def __init__(self, failure: MeasureFailure) -> None:
        super().__init__(failure.describe())
        self.failure = failure
