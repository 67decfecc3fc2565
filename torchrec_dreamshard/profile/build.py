"""Measuring a machine profile within a budget: the reference kernel, calibration, then the
type choice's timings (a part that fails is left out and kept in ``failures``)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from torchrec_dreamshard.calibration.auto import calibration_to_run, check_machine
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
from torchrec_dreamshard.verification.round_cost import measurement_seconds, verification_seconds

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy import CandidateSource, DreamShard

T = TypeVar("T")
logger = logging.getLogger("torchrec_dreamshard.profile")

MIN_PATH_S = 8.0  # fewer seconds left than this (beside the reserve): the path is not timed
MIN_CALIBRATION_S = 6.0  # fewer seconds left than this: calibration is skipped
VERIFY_RESERVE = 0.4  # of the plan's budget, kept for the verification where it verifies
MAX_VERIFY_RESERVE = 0.75  # ... raised to what its fewest measurements take, up to this
LOOP_S = 1.5  # what TorchRec's loop takes between the profile and the verification (s)
# what a type-choice timing takes where nothing is cached (s): calibration leaves it room
EXPECTED_S = {"collectives": 1.5, "dense kernel": 2.0, "sharding path": 6.0}


@dataclass(frozen=True)
class ProfileRequest:
    """What a profile is measured for.

    Attributes:
        reference: measures (or loads) the reference kernel's ``(fwd, bwd)`` ms.
        collectives: measures (or loads) the collective models (``None``: not needed; the
            dense kernel's model alike).
        sharding_path: ``sharding_path(may_measure)``: loaded where cached, else measured
            where ``may_measure`` (``None``: not needed).
        calibration: calibration settings (``None``: never calibrate).
        auto: calibrate only where the reference kernel is mispriced (or a running job's
            kernels of these tables are stored).
        task: gives the tables calibration measures (asked only where it calibrates).
        verifies: ``verifies(calibrates)``: whether the plan will be verified.
        cached: the type-choice timings cached on this machine, by name.
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
    verifies: Callable[[bool], bool] = lambda calibrates: False
    cached: frozenset[str] = frozenset()


class _Log:
    """What a profile's measuring noted, failed and spent, and the seconds it may spend."""

    def __init__(self, budget: Budget, device: str) -> None:
        self.budget = budget
        self.kept = 0.0
        self.device = device
        self.notes: list[str] = []
        self.failures: list[MeasureFailure] = []
        self.spent: dict[str, float] = {}

    def attempt(self, what: str, fn: Callable[[], T]) -> T | None:
        """``fn()``, or ``None`` where measuring failed (kept in ``failures``)."""
        start = self.budget.elapsed()
        try:
            out = guarded(f"profile: {what}", fn, device=self.device)
        finally:
            self.spent[what] = self.spent.get(what, 0.0) + self.budget.elapsed() - start
        if isinstance(out, MeasureFailure):
            self.failures.append(out)
            return None
        return out

    def left(self) -> float:
        """Seconds the profile may still spend (the verification's share kept back)."""
        return max(0.0, self.budget.remaining() - self.kept)


def unmeasured_profile(
    stamp: MachineStamp,
    why: str,
    collectives: CollectiveModels | None = None,
    collectives_source: str = "none",
) -> MachineProfile:
    """A profile of nothing measured (``collectives``: analytic ones); ``why`` says why."""
    return MachineProfile(
        stamp=stamp, collectives=collectives, collectives_source=collectives_source, notes=(why,)
    )


def build_profile(prior: DreamShard, request: ProfileRequest, budget: Budget) -> MachineProfile:
    """Measure the profile ``request`` asks for within ``budget`` (a failed part is left out)."""
    log = _Log(budget, request.stamp.device)
    tables = functools.cache(request.task) if request.task is not None else None
    request = dataclasses.replace(request, task=tables)
    reference = log.attempt("reference kernel", request.reference)
    predicted = check_machine(prior, None).predicted_ms
    config = _calibrates(prior, request, reference)
    if request.verifies(config is not None) and budget.seconds is not None:
        log.kept = _verification_reserve(prior, request, reference, budget.seconds, log)
    timings = [name for name in _timings(request) if name not in request.cached]
    to_come = sum(EXPECTED_S[name] for name in timings)
    cal = _calibration(prior, request, log, to_come, config) if config is not None else None
    collectives = None
    if request.collectives is not None:
        collectives = log.attempt("collectives", request.collectives)
    dense = None
    if request.dense_kernel is not None:
        dense = log.attempt("dense kernel", request.dense_kernel)
    path = _sharding_path(request, log)
    if request.cached:
        log.notes.append(
            "measured once per machine, loaded from its cache: " + ", ".join(sorted(request.cached))
        )
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


def _verification_reserve(
    prior: DreamShard,
    request: ProfileRequest,
    reference: tuple[float, float] | None,
    seconds: float,
    log: _Log,
) -> float:
    """The seconds kept for the verification: :data:`VERIFY_RESERVE` of the budget, raised
    to what its fewest measurements take here (the checkpoint's kernels scaled by how far
    it prices the reference kernel off), up to :data:`MAX_VERIFY_RESERVE` of the budget;
    where even that is too little, the verification cannot run and the usual share is kept."""
    share = VERIFY_RESERVE * seconds
    task = request.task() if request.task is not None else None
    if task is None or not task.tables:
        return share
    check = check_machine(prior, reference)
    scale = 1.0 if check.error is None else 1.0 / (1.0 + check.error)
    placement = [i % task.num_devices for i in range(len(task.tables))]
    one = measurement_seconds(prior, task, placement, scale)
    need = verification_seconds(one) + LOOP_S
    if need <= share:
        return share
    if need <= MAX_VERIFY_RESERVE * seconds:
        log.notes.append(
            f"the verification's share raised to {need:.1f} s of the {seconds:.0f} s budget: "
            f"one measurement of a plan takes about {one:.1f} s here (predicted)"
        )
        return need
    log.notes.append(
        f"a verification would need {need:.1f} s of the {seconds:.0f} s budget (one measurement "
        f"of a plan takes about {one:.1f} s here, predicted): more than "
        f"{MAX_VERIFY_RESERVE:.0%} of it, so the plan will likely go unverified"
    )
    return share


def _timings(request: ProfileRequest) -> list[str]:
    asked = {
        "collectives": request.collectives,
        "dense kernel": request.dense_kernel,
        "sharding path": request.sharding_path,
    }
    return [name for name, source in asked.items() if source is not None]


def _calibrates(
    prior: DreamShard, request: ProfileRequest, reference: tuple[float, float] | None
) -> CalibrationConfig | None:
    """How the profile calibrates, if it does (automatic: not without the reference)."""
    if request.task is None or (request.auto and reference is None):
        return None
    mispriced = check_machine(prior, reference).mispriced
    return calibration_to_run(
        request.calibration, request.auto, mispriced, lambda: _observed(request)
    )


def _observed(request: ProfileRequest) -> bool:
    """Whether the store holds a running job's kernels of the request's tables."""
    task = request.task() if request.task is not None else None
    return bool(task and task.tables) and stored_observations(request.calibration, task)


def _sharding_path(request: ProfileRequest, log: _Log) -> ShardingPathModel | None:
    """The sharding path's cost: cached, else timed while :data:`MIN_PATH_S` is left."""
    if request.sharding_path is None:
        return None
    left = log.left()
    may_measure = "sharding path" in request.cached or left >= MIN_PATH_S
    path = log.attempt("sharding path", lambda: request.sharding_path(may_measure))
    if path is None and not may_measure:
        log.notes.append(
            f"sharding path not timed: {left:.1f} s of the plan's budget left beside the "
            f"verification's share (it needs {MIN_PATH_S:.0f} s); no path cost charged, so "
            "the type choice may keep a table-wise path that every table data-parallel "
            "would save"
        )
    return path


def _calibration(
    prior: DreamShard,
    request: ProfileRequest,
    log: _Log,
    to_come: float,
    config: CalibrationConfig,
) -> ProfileCalibration | None:
    """Calibrate within what is left beside ``to_come`` seconds of timings (or ``None``)."""
    task = request.task() if request.task is not None else None
    if task is None or not task.tables:
        return None
    if request.auto and not config.measure_missing:  # a running job's kernels only
        log.notes.append("calibrating on the kernels observed in a running job")
    left = log.left()
    if left < MIN_CALIBRATION_S:
        log.notes.append(
            f"calibration skipped: {left:.1f} s of the plan's budget left beside the "
            f"verification's share (it needs {MIN_CALIBRATION_S:.0f} s); planning with the "
            "checkpoint's kernels"
        )
        return None
    if math.isfinite(left):
        seconds = max(MIN_CALIBRATION_S, min(config.budget_s, left - to_come))
        if seconds < config.budget_s:
            log.notes.append(
                f"calibration given {seconds:.0f} s of the {config.budget_s:.0f} s it asks "
                "for (the plan's budget): kernels it had no time for are priced by the network"
            )
            config = dataclasses.replace(config, budget_s=seconds)
    return _calibrated(prior, request, task, config, log)


def _calibrated(
    prior: DreamShard, request: ProfileRequest, task: Task, config: CalibrationConfig, log: _Log
) -> ProfileCalibration | None:
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
