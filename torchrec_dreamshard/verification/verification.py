"""Verification (:func:`verify`): candidate plans measured in interleaved rounds, a noisy
first pass measured again, plans clearly behind dropped (:mod:`.dropping`), and the plan
kept (:mod:`.plan_ranking`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.device_sets import DeviceSetTimes
from torchrec_dreamshard.measure.guard import warn_failures
from torchrec_dreamshard.measure.progress import progress_bar
from torchrec_dreamshard.measure.rounds import measure_in_rounds
from torchrec_dreamshard.verification.candidate_plans import heuristic_plans as heuristic_plans
from torchrec_dreamshard.verification.candidate_plans import verify_candidates
from torchrec_dreamshard.verification.dropping import Dropping
from torchrec_dreamshard.verification.noise import Noise, NoiseLimits
from torchrec_dreamshard.verification.plan_ranking import keep
from torchrec_dreamshard.verification.round_cost import (
    BUDGET_STRETCH,
    MIN_PLANS,
    MIN_ROUNDS,
    first_rounds_seconds,
    too_slow_for_all,
    unit_seconds,
)
from torchrec_dreamshard.verification.verify_cache import (
    read_rounds,
    verification_cache_file,
    write_rounds,
)
from torchrec_dreamshard.verification.verify_result import VerifiedPlan, VerifyResult
from torchrec_dreamshard.verification.verify_timing import (
    MeasuringFailed,
    Timing,
    guarded_reference,
    guarded_step,
    kernel_timing,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy import PlacementAgent


@dataclass(frozen=True)
class VerifyOptions:
    """How :func:`verify` measures and keeps.

    Args:
        rounds: interleaved rounds of the first pass.
        budget_s: measure no plan that would end past this many seconds (``None``: all
            rounds); a round cut short is dropped.
        cache: read and write the rounds in this machine's cache (:mod:`.verify_cache`).
        incumbent: the plan that stands unless beaten every round (``None``: the fastest
            heuristic's).
        progress: show a progress bar.
        noise: when the measurements count as noisy.
        deadline_s: a hard cap over both passes (``None``: none).
        drop: drop plans clearly behind after a round (:mod:`.dropping`).
    """

    rounds: int = 3
    budget_s: float | None = None
    cache: bool = False
    incumbent: str | None = None
    progress: bool = False
    noise: NoiseLimits = field(default_factory=NoiseLimits)
    deadline_s: float | None = None
    drop: bool = True


def verify(
    agent: PlacementAgent,
    task: Task,
    k: int = 4,
    config: MeasureConfig | None = None,
    options: VerifyOptions | None = None,
    *,
    extra: Mapping[str, Sequence[int]] | None = None,
    baselines: Mapping[str, Sequence[int]] | None = None,
    timing: Timing | None = None,
) -> VerifyResult:
    """Measure the ``k`` best-rated candidates, the ``baselines``, the heuristics' plans and
    the ``extra`` plans in interleaved rounds, and rank them, the kept plan first.

    A measurement that fails raises nothing: the plans come back unmeasured, in the order
    proposed, with the ``failure``.

    Args:
        config: the measurement settings (one timing round per measurement).
        timing: what measures (default :func:`kernel_timing`).

    Raises:
        ValueError: ``k`` or ``options.rounds`` below 1.
    """
    options = options or VerifyOptions()
    if k < 1 or options.rounds < 1:
        raise ValueError(f"verify needs k >= 1 and rounds >= 1, got {k}, {options.rounds}")
    clock = timing.clock if timing is not None else time.perf_counter
    start = clock()
    config = replace(config or MeasureConfig(), rounds=1)
    plans = verify_candidates(agent, task, k, extra, baselines)
    path = verification_cache_file(task, plans, config, options.rounds) if options.cache else None
    if path is not None:
        passes = read_rounds(path, plans)
        if passes is not None:
            return _result(plans, options, passes, clock() - start, cached=True)
    try:
        run = _measure_passes(task, plans, options, timing or kernel_timing(config), config.device)
    except MeasuringFailed as failed:
        warn_failures([failed.failure], "the planner's chosen plan is kept, not measured")
        seconds = clock() - start
        return VerifyResult(list(plans), seconds, failure=failed.failure)
    rounds = run.rounds
    for i, p in enumerate(run.plans):  # the last pass decides; a noisy first is kept apart
        p.rounds_ms = [r[i] for r in rounds[-1] if i in r]
        p.earlier_ms = [r[i] for r in rounds[0] if i in r] if len(rounds) > 1 else []
        p.dropped = run.dropping.dropped.get(i)
    if path is not None:
        write_rounds(path, plans, run.passes)
    result = _result(plans, options, run.passes, clock() - start)
    if run.shared is not None:
        result.devices_timed, result.candidate_devices = run.shared.timed, run.shared.devices
    return result


def _result(
    plans: Sequence[VerifiedPlan],
    options: VerifyOptions,
    passes: list[Noise],
    seconds: float,
    cached: bool = False,
) -> VerifyResult:
    """The ranked measured plans, then the plans that dropped out, then those left out."""
    dropped = [p for p in plans if p.dropped is not None]
    for p in dropped:
        p.measured_ms = float(np.median([*p.earlier_ms, *p.rounds_ms]))
    dropped.sort(key=lambda p: p.measured_ms or 0.0)
    ranked_ = [p for p in plans if p.dropped is None]
    measured = [p for p in ranked_ if p.rounds_ms] or ranked_
    left_out = [p for p in ranked_ if all(p is not m for m in measured)]
    ranked, why = keep(measured, options.incumbent, passes)
    return VerifyResult(
        [*ranked, *dropped, *left_out],
        seconds,
        cached,
        passes,
        fallback=why,
        left_out=len(left_out),
    )


@dataclass
class _Measuring:
    """What every pass of one verification measures with."""

    task: Task
    plans: Sequence[VerifiedPlan]
    step_ms: Callable[[Task, list[int]], float]  # guarded
    clock: Callable[[], float]
    bar: Any
    end: float | None  # the hard cap, on ``clock``
    dropping: Dropping
    shared: DeviceSetTimes | None  # one round's device-set timings, where the timing shares


@dataclass
class _Measured:
    """What :func:`_measure_passes` measured: plans, rounds per pass, noise, drops, sets."""

    plans: list[VerifiedPlan]
    rounds: list[list[dict[int, float]]]
    passes: list[Noise]
    dropping: Dropping
    shared: DeviceSetTimes | None


def _measuring(
    task: Task,
    plans: Sequence[VerifiedPlan],
    options: VerifyOptions,
    timing: Timing,
    device: str,
    bar: Any,
) -> _Measuring:
    """The guarded step, the hard cap and the drop rule of one verification."""
    end = None if options.deadline_s is None else timing.clock() + options.deadline_s
    shared = DeviceSetTimes() if timing.shared_step_ms is not None else None

    def step(task: Task, placement: list[int]) -> float:
        if shared is None:
            return timing.step_ms(task, placement)
        return timing.shared_step_ms(task, placement, shared)  # a shared device set: once a round

    dropping = Dropping(plans, options.incumbent, options.drop)
    guarded = guarded_step(step, plans, device)
    return _Measuring(task, plans, guarded, timing.clock, bar, end, dropping, shared)


def _measure_passes(
    task: Task,
    plans: Sequence[VerifiedPlan],
    options: VerifyOptions,
    timing: Timing,
    device: str = "cpu",
) -> _Measured:
    """Every pass's rounds and noise: the first, and a second where it was noisy."""
    limits = options.noise
    reference = None
    if timing.reference_ms is not None and math.isfinite(limits.drift):
        reference = guarded_reference(timing.reference_ms, device)
    extra = options.rounds if limits.extra_rounds is None else limits.extra_rounds
    bar = progress_bar(options.rounds * len(plans), "verify: measuring plans", options.progress)
    m = _measuring(task, plans, options, timing, device, bar)
    try:
        before = reference() if reference is not None else None
        try:
            rounds = [_one_pass(m, options.rounds, options.budget_s, probe=True)]
        except _TooSlow as slow:
            sharing = m.shared is not None
            chosen = too_slow_for_all(
                task,
                plans,
                (options.budget_s, options.rounds, options.incumbent),
                slow.unit_s,
                sharing,
            )
            m.plans = chosen
            m.dropping = Dropping(chosen, options.incumbent, options.drop)
            if bar is not None:
                bar.reset(total=options.rounds * len(chosen))
                bar.set_description(f"verify: a slow task, measuring {len(chosen)} plans")
            rounds = [_one_pass(m, options.rounds, options.budget_s)]
        after = reference() if reference is not None else None
        passes = [Noise.of(rounds[0], (before, after), limits)]
        if passes[0].noisy and extra > 0 and rounds[0]:
            m.dropping.after_round(rounds[0], 0)  # what the first pass's last round showed
            m.dropping.next_pass(rounds[0])
            if bar is not None:
                bar.total += extra * len(m.dropping.active())
                bar.set_description("verify: noisy, measuring again")
            budget = None if options.budget_s is None else options.budget_s * limits.extra_budget
            more = _one_pass(m, extra, budget, pass_index=1)
            if more:
                again = reference() if reference is not None else None
                passes.append(Noise.of(more, (after, again), limits))
                rounds.append(more)
    finally:
        if bar is not None:
            bar.close()
    return _Measured(list(m.plans), rounds, passes, m.dropping, m.shared)


def _one_pass(
    m: _Measuring,
    rounds: int,
    budget_s: float | None,
    probe: bool = False,
    pass_index: int = 0,
) -> list[dict[int, float]]:
    """``rounds`` interleaved rounds of the active plans within ``budget_s``, the first
    :data:`MIN_ROUNDS` within :data:`BUDGET_STRETCH` times it (``probe``: else
    :class:`_TooSlow`)."""
    start = m.clock()
    took: list[float] = []  # seconds of each measurement so far
    done: list[dict[int, float]] = []

    def measure(_: int, i: int) -> float:
        now = m.clock()
        stretch = BUDGET_STRETCH if len(done) < min(MIN_ROUNDS, rounds) else 1.0
        limit = None if budget_s is None else start + budget_s * stretch
        expected = now + float(np.mean(took or [0.0]))
        if (limit is not None and expected > limit) or (m.end is not None and expected > m.end):
            raise _OutOfTime
        ms = m.step_ms(m.task, m.plans[i].placement)
        took.append(m.clock() - now)
        if m.bar is not None:
            m.bar.update(1)
        if probe and budget_s is not None and len(took) == 1 and len(m.plans) > MIN_PLANS:
            _probe(m, rounds, budget_s, i, took[0])
        return float(ms)

    try:
        for r in range(rounds):
            if m.shared is not None:
                m.shared.new_round()  # a round's figures are shared within it only
            done[:] = measure_in_rounds([m.dropping.active()], measure, r + 1, done=[done])[0]
            if r == rounds - 1:
                break  # after the last round, nothing is left to save (a second pass drops)
            before = len(m.dropping.dropped)
            m.dropping.after_round(done, pass_index)
            if m.bar is not None:
                m.bar.total -= (len(m.dropping.dropped) - before) * (rounds - r - 1)
    except _OutOfTime:
        pass  # the round cut short is not in ``done``
    return done


def _probe(m: _Measuring, rounds: int, budget_s: float, first: int, seconds: float) -> None:
    """Raise :class:`_TooSlow` where the first rounds of every plan would not fit."""
    sharing = m.shared is not None
    unit_s = unit_seconds(m.task, m.plans[first], seconds, sharing)
    if first_rounds_seconds(m.task, m.plans, rounds, unit_s, sharing) > budget_s * BUDGET_STRETCH:
        raise _TooSlow(seconds, unit_s)


class _OutOfTime(Exception):
    """The verification's budget ends before the next measurement would."""


class _TooSlow(Exception):
    """The first rounds of every plan would not fit even the stretched budget."""

    def __init__(self, seconds: float, unit_s: float) -> None:
        super().__init__(f"one measurement took {seconds:.1f} s")
        self.seconds, self.unit_s = seconds, unit_s
