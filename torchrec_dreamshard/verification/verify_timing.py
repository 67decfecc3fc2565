"""What verification measures with (:class:`Timing`: the real kernels',
:func:`kernel_timing`, or a test's), and its measurements guarded
(:func:`guarded_step`, :func:`guarded_reference`): a measurement that fails on this machine
(:mod:`torchrec_dreamshard.measure.guard`) raises :class:`MeasuringFailed` with its record,
which ends the verification."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchrec_dreamshard.cost.collective_models import local_all_to_all
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure import placement_timing, reference_speed
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.device_sets import DeviceSetTimes
from torchrec_dreamshard.measure.guard import MeasureFailure, guarded

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.verification.verify_result import VerifiedPlan


@dataclass(frozen=True)
class Timing:
    """What :func:`~.verification.verify` measures with: ``step_ms(task, placement)``,
    one measured step of a plan, ``reference_ms()``, the reference kernel now (``None``:
    not timed), and ``clock()``, the seconds its budget is kept by
    (``time.perf_counter``). :func:`kernel_timing` gives the real kernels'; tests pass
    others (and a clock they move themselves, so that what the budget decides does not
    hang on the machine's load). ``shared_step_ms(task, placement, shared)``, where
    given, is ``step_ms`` that takes the device sets the round's
    :class:`~torchrec_dreamshard.measure.device_sets.DeviceSetTimes` already timed as
    they are (the verification then shares them within each round; ``None``: every
    plan is measured on its own)."""

    step_ms: Callable[[Task, list[int]], float]
    reference_ms: Callable[[], float] | None = None
    clock: Callable[[], float] = time.perf_counter
    shared_step_ms: Callable[[Task, list[int], DeviceSetTimes], float] | None = None


def kernel_timing(config: MeasureConfig) -> Timing:
    """Real FBGEMM kernels:
    :func:`~torchrec_dreamshard.measure.placement_timing.measure_placement` with ``config``
    and the machine's all-to-all model, on its own or sharing a round's device sets,
    and the reference kernel's fwd + bwd
    (:func:`~torchrec_dreamshard.measure.reference_speed.measure_reference_ms`)."""

    def shared_step_ms(task: Task, placement: list[int], shared: DeviceSetTimes | None) -> float:
        comm = local_all_to_all(task.num_devices, path=config.comm_model_path)
        m = placement_timing.measure_placement(task, placement, config, comm=comm, shared=shared)
        if not m.ok:
            raise RuntimeError(str(m.error))
        return float(m.step_ms)

    def step_ms(task: Task, placement: list[int]) -> float:
        return shared_step_ms(task, placement, None)

    def reference_ms() -> float:
        return float(sum(reference_speed.measure_reference_ms(config.device)))

    return Timing(step_ms, reference_ms, shared_step_ms=shared_step_ms)


def guarded_step(
    step_ms: Callable[[Task, list[int]], float], plans: Sequence[VerifiedPlan], device: str
) -> Callable[[Task, list[int]], float]:
    """``step_ms`` guarded: a measurement that fails raises :class:`MeasuringFailed`
    naming the plan (by its name among ``plans``) and the cause."""
    names = {tuple(p.placement): p.name for p in plans}

    def step(task: Task, placement: list[int]) -> float:
        name = names.get(tuple(placement), "a plan")
        ms = guarded(
            f"verification: measuring plan {name}",
            lambda: checked_step(step_ms, task, placement),
            device=device,
            warn=False,
        )
        if isinstance(ms, MeasureFailure):
            raise MeasuringFailed(ms)
        return ms

    return step


def checked_step(
    step_ms: Callable[[Task, list[int]], float], task: Task, placement: list[int]
) -> float:
    """``step_ms`` of the plan; a time that is not a finite, non-negative number of ms is a
    failed measurement (``RuntimeError``)."""
    ms = float(step_ms(task, placement))
    if not (math.isfinite(ms) and ms >= 0):
        raise RuntimeError(f"the timer gave {ms} ms for one step")
    return ms


def guarded_reference(reference_ms: Callable[[], float], device: str) -> Callable[[], float]:
    """``reference_ms`` guarded: a timing that fails raises :class:`MeasuringFailed`."""

    def reference() -> float:
        ms = guarded("verification: the reference kernel", reference_ms, device=device, warn=False)
        if isinstance(ms, MeasureFailure):
            raise MeasuringFailed(ms)
        return ms

    return reference


class MeasuringFailed(Exception):
    """A measurement of the verification failed on this machine (its record attached)."""

    def __init__(self, failure: MeasureFailure) -> None:
        super().__init__(failure.describe())
        self.failure = failure
