"""Measuring a machine profile (:func:`build_profile`) within a budget.

The parts, in order, each taken only when asked for and while the budget lasts:

1. the reference kernel (cached per machine), and the checkpoint's prediction of it;
2. the collective models the type choice prices other sharding types with, and the dense
   kernel's model (both cached per machine and topology);
3. the cost of a sharding path (cached per machine; where not cached, timed on 2 spawned
   ranks only while at least :data:`MIN_PATH_S` of the budget is left);
4. calibration on the user's tables, where asked for or where the reference kernel says
   the checkpoint misprices this machine (every kernel kept in the calibration store).

A part that fails (a kernel error, an out-of-memory, a collective that times out, an op
missing from this FBGEMM build: :func:`~torchrec_dreamshard.measure.guard.guarded`) is
left out: the planner goes on with the checkpoint as it is, one warning names the cause,
and the profile's ``failures`` keeps it. A CUDA topology
on a machine without CUDA is never timed on the CPU as a stand-in: nothing is measured.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from torchrec_dreamshard.calibration.auto import check_machine
from torchrec_dreamshard.calibration.fine_tuning import (
    CalibrationConfig,
    calibrate,
    stored_observations,
)
from torchrec_dreamshard.cost.collective_models import CollectiveModels
from torchrec_dreamshard.cost.dense_kernel_model import DenseKernelModel
from torchrec_dreamshard.cost.sharding_path_model import ShardingPathModel
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure.guard import MeasureFailure, guarded
from torchrec_dreamshard.profile.budget import Budget
from torchrec_dreamshard.profile.machine_profile import MachineProfile, ProfileCalibration
from torchrec_dreamshard.profile.stamp import MachineStamp

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy import CandidateSource, DreamShard

T = TypeVar("T")
logger = logging.getLogger("torchrec_dreamshard.profile")

MIN_PATH_S = 15.0  # fewer seconds left than this: the sharding path is not timed
MIN_CALIBRATION_S = 6.0  # fewer seconds left than this: calibration is skipped
CALIBRATION_SHARE = 0.5  # of the seconds left after the machine's models, for calibration


@dataclass(frozen=True)
class ProfileRequest:
    """What a profile is measured for.

    Attributes:
        stamp: the machine and topology it is for.
        reference: measures (or loads) the reference kernel's ``(fwd, bwd)`` ms.
        collectives: measures (or loads) the collective models (``None``: not needed,
            the search space offers no other type than table-wise).
        collectives_source: where ``collectives`` takes them from, in words.
        dense_kernel: measures (or loads) the dense kernel's model (``None``: not
            needed).
        sharding_path: ``sharding_path(may_measure)`` loads the cost of a sharding path
            where cached, else measures it where ``may_measure`` (``None``: not needed;
            giving ``None``: not cached and not measured, or not measured on this
            machine).
        calibration: calibration settings (``None``: never calibrate).
        auto: calibrate only where the reference kernel is mispriced (or the store holds
            a running job's kernels of these tables, which costs no measuring).
        task: gives the tables calibration measures (asked for only where it
            calibrates; ``None``, or giving ``None``: none to calibrate on).
        sources: the candidate sources whose plans' device groups calibration measures.
    """

    stamp: MachineStamp
    reference: Callable[[], tuple[float, float] | None]
    collectives: Callable[[], CollectiveModels] | None = None
    collectives_source: str = "none"
    dense_kernel: Callable[[], DenseKernelModel | None] | None = None
    sharding_path: Callable[[bool], ShardingPathModel | None] | None = None
    calibration: CalibrationConfig | None = None
    auto: bool = True
    task: Callable[[], Task | None] | None = None
    sources: Sequence[CandidateSource] | None = None


class _Log:
    """What a profile's measuring noted, failed and spent."""

    def __init__(self, budget: Budget, device: str) -> None:
        self.budget = budget
        self.device = device
        self.notes: list[str] = []
        self.failures: list[MeasureFailure] = []
        self.spent: dict[str, float] = {}

    def attempt(self, what: str, fn: Callable[[], T]) -> T | None:
        """``fn()``, or ``None`` where measuring failed
        (:func:`~torchrec_dreamshard.measure.guard.guarded`: the cause warned once and
        kept)."""
        start = self.budget.elapsed()
        try:
            out = guarded(f"profile: {what}", fn, device=self.device)
        finally:
            self.spent[what] = self.spent.get(what, 0.0) + self.budget.elapsed() - start
        if isinstance(out, MeasureFailure):
            self.failures.append(out)
            return None
        return out


def unmeasured_profile(
    stamp: MachineStamp,
    why: str,
    collectives: CollectiveModels | None = None,
    collectives_source: str = "none",
) -> MachineProfile:
    """A profile of nothing measured: the checkpoint as it is, and ``collectives`` where
    given (analytic models need no measuring); ``why`` says why."""
    return MachineProfile(
        stamp=stamp, collectives=collectives, collectives_source=collectives_source, notes=(why,)
    )


def build_profile(prior: DreamShard, request: ProfileRequest, budget: Budget) -> MachineProfile:
    """Measure the profile ``request`` asks for, within ``budget``
    (see the module docstring). Never raises for a measurement that fails."""
    log = _Log(budget, request.stamp.device)
    reference = log.attempt("reference kernel", request.reference)
    predicted = check_machine(prior, None).predicted_ms
    collectives = None
    if request.collectives is not None:
        collectives = log.attempt("collectives", request.collectives)
    dense = None
    if request.dense_kernel is not None:
        dense = log.attempt("dense kernel", request.dense_kernel)
    path = _sharding_path(request, log)
    cal = _calibration(prior, request, reference, log)
    return MachineProfile(
        stamp=request.stamp,
        reference_ms=reference,
        reference_predicted_ms=predicted,
        collectives=collectives,
        collectives_source=request.collectives_source if collectives is not None else "none",
        dense_kernel=dense,
        sharding_path=path,
        calibration=cal,
        notes=tuple(log.notes),
        failures=tuple(f.to_dict() for f in log.failures),
        spent_s=dict(log.spent),
    )


def _sharding_path(request: ProfileRequest, log: _Log) -> ShardingPathModel | None:
    """The sharding path's cost where asked for: loaded where cached, else timed while
    :data:`MIN_PATH_S` of the budget is left (see the module docstring)."""
    if request.sharding_path is None:
        return None
    left = log.budget.remaining()
    may_measure = left >= MIN_PATH_S
    path = log.attempt("sharding path", lambda: request.sharding_path(may_measure))
    if path is None and not may_measure:
        log.notes.append(
            f"sharding path not timed: {left:.1f} s of the plan's budget left (it needs "
            f"{MIN_PATH_S:.0f} s); no path cost charged, so the type choice may keep a "
            "table-wise path that every table data-parallel would save"
        )
    return path


def _calibration(
    prior: DreamShard,
    request: ProfileRequest,
    reference: tuple[float, float] | None,
    log: _Log,
) -> ProfileCalibration | None:
    """Calibrate where the request asks for it and the budget allows (see the module
    docstring); ``None`` where it does not."""
    config = request.calibration
    if config is None or request.task is None:
        return None
    mispriced = check_machine(prior, reference).mispriced
    if request.auto and reference is None:
        return None  # nothing says the checkpoint misprices this machine
    task = request.task()
    if task is None or not task.tables:
        return None
    if request.auto and not mispriced:
        if not stored_observations(config, task):
            return None
        config = dataclasses.replace(config, measure_missing=False)  # a running job's kernels
        log.notes.append("calibrating on the kernels observed in a running job")
    left = log.budget.remaining()
    if left < MIN_CALIBRATION_S:
        log.notes.append(
            f"calibration skipped: {left:.1f} s of the plan's budget left "
            f"(it needs {MIN_CALIBRATION_S:.0f} s); planning with the checkpoint's kernels"
        )
        return None
    seconds = min(config.budget_s, left * CALIBRATION_SHARE) if left != float("inf") else None
    if seconds is not None and seconds < config.budget_s:
        given = max(MIN_CALIBRATION_S, seconds)
        log.notes.append(
            f"calibration given {given:.0f} s of the {config.budget_s:.0f} s it asks for "
            "(the plan's budget): kernels it had no time for are priced by the network"
        )
        config = dataclasses.replace(config, budget_s=given)
    result = log.attempt("calibration", lambda: calibrate(prior, task, config, request.sources))
    if result is None:
        return None
    log.failures.extend(result.failures)  # kernels that failed alone, left out
    if not result.samples:
        log.notes.append(
            "calibration kept no kernel (" + (result.note or "none measured") + "): "
            "planning with the checkpoint's kernels"
        )
        return None
    if result.skipped:
        log.notes.append(
            f"calibration left {result.skipped} kernels unmeasured within its "
            f"{config.budget_s:.0f} s; they are priced by the calibrated network"
        )
    return ProfileCalibration(
        prior=prior.fingerprint(),
        cost_net={k: v.detach().clone() for k, v in result.agent.cost_net.state_dict().items()},
        meta=dict(result.agent.meta),
        summary=result.summary(),
        record={**result.to_dict(), "lines": result.lines()},
    )
