"""Verification (:func:`verify`): the best-rated candidate plans, every classic
heuristic's plan and TorchRec's own plan for the same tables measured on real kernels in
interleaved rounds, and the plan kept by the rules of :mod:`.plan_ranking`.

A busy machine (:class:`~.noise.Noise`): the reference kernel is timed before and after
the rounds, and each plan's rounds are compared. When the rounds disagree (median relative
spread over :data:`~.noise.SPREAD_LIMIT`) or the reference drifted (over
:data:`~.noise.DRIFT_LIMIT`), the plans are measured again (as many rounds, within as much
budget again: see :class:`~.noise.NoiseLimits`) and those rounds decide if they are quiet.
If they are noisy too, both passes' rounds decide together, and the safer plan
(TorchRec's, else the fastest heuristic's) is kept unless a plan beat it beyond the noise
over all of them (:func:`~.plan_ranking.keep`); the result says so.

The measuring buys the most per second: within a round, a device table-set that several
plans hold is timed once and its figure shared (the real kernels' timing:
:mod:`~torchrec_dreamshard.measure.device_sets`; the result counts the sets timed against
the plans' devices), and a plan clearly behind after a round drops out of later rounds
(:mod:`.dropping`: never TorchRec's plan, nor the plan the ranking would keep).

A measurement that fails on this machine (a CUDA error, an out-of-memory, an FBGEMM
operator missing from the build, a collective's failure:
:mod:`torchrec_dreamshard.measure.guard`) ends the verification: nothing it measured is
compared, the planner's chosen plan (the first ``extra`` plan, else the best-rated) is
kept, one warning names the cause and the result records it (``VerifyResult.failure``).

What was measured and its words: :mod:`.verify_result`; this machine's cache of the
rounds: :mod:`.verify_cache`.
"""

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
        budget_s: measure no plan that would end past this many seconds (at the mean time
            a measurement took so far); a round cut short is dropped (``None``: all
            rounds). The second pass, where the first was noisy, has its own budget
            (:attr:`NoiseLimits.extra_budget`).
        cache: read the rounds of these very plans of this task from this machine's
            cache, or write them there once measured
            (:func:`~.verify_cache.verification_cache_file`).
        incumbent: the name of the plan (an ``extra`` one) that stands unless another
            measured faster in every round (``None``: the fastest heuristic's).
        progress: a progress bar (see :func:`progress_bar`).
        noise: when the measurements count as noisy (:class:`NoiseLimits`).
        deadline_s: a hard cap over everything the verification measures, both passes
            included: no measurement starts that would end past it, whatever
            ``budget_s`` lets the first rounds stretch to (``None``: none). The planner
            sets it from what is left of ``timeout_seconds``.
        drop: a plan clearly behind after a round drops out of later rounds
            (:mod:`.dropping`; ``False``: every plan is measured in every round).
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
    """Measure the ``k`` best-rated candidates, the ``baselines`` (TorchRec's plan) and the
    heuristics' plans (see :func:`verify_candidates`; ``extra`` adds named plans) in
    interleaved rounds (:func:`~torchrec_dreamshard.measure.rounds.measure_in_rounds`: each
    round visits every plan once, the order rotated round by round), with the reference
    kernel timed before and after; where that pass was noisy, a second (see the module
    docstring). The plans kept first (:func:`~.plan_ranking.keep`), then by median
    measured step.

    Args:
        config: the measurement settings (one timing round per measurement).
        options: rounds, budget, cache, incumbent, progress and noise limits.
        timing: what measures (default :func:`kernel_timing`).

    A measurement that fails on this machine raises nothing: the result keeps the plans
    in the order proposed (the ``extra`` plans first), measured in no round, with the
    ``failure`` (see the module docstring).

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
    """The plans kept and ranked (:func:`~.plan_ranking.keep`) among those measured in
    every round; the plans that dropped out (:mod:`.dropping`) after them, by median over
    their rounds; then the plans a slow task left out (:func:`~.round_cost.too_slow_for_all`)."""
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
    """What :func:`_measure_passes` measured: the plans measured, every pass's rounds
    (``{index among them: ms}`` each), their noise, the plans that dropped out and the
    device sets timed."""

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
    """The guarded step (sharing device sets within a round where ``timing`` can), the
    hard cap and the drop rule of one verification of ``plans``."""
    end = None if options.deadline_s is None else timing.clock() + options.deadline_s
    shared = DeviceSetTimes() if timing.shared_step_ms is not None else None
    shared_step = timing.shared_step_ms

    def step(task: Task, placement: list[int]) -> float:
        if shared is None or shared_step is None:
            return timing.step_ms(task, placement)
        return shared_step(task, placement, shared)

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
    """The plans measured (all, unless the task is too slow for all of them: see
    :func:`~.round_cost.too_slow_for_all`), every pass's rounds and noise: the first pass,
    and where it was noisy a second (when it measured a whole round), which decides. Every
    measurement is :func:`~torchrec_dreamshard.measure.guard.guarded` (on ``device``); the
    first that fails raises :class:`MeasuringFailed`."""
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
    """``rounds`` interleaved rounds of every plan still measured (see :mod:`.dropping`:
    after each round but the last, the plans clearly behind drop out) within ``budget_s``
    (whole rounds only).

    The first :data:`MIN_ROUNDS` rounds (the fewest a sign test can decide on) may run on
    to :data:`BUDGET_STRETCH` times the budget: a budget that does not fit them (many
    devices, big tables) grows with the task rather than leave the plans unranked. With
    ``probe``, where the first measurement says those rounds of every plan would not fit
    even so, :class:`_TooSlow` is raised (with a device timing's seconds) for the caller
    to measure fewer plans. ``m.end`` (on ``m.clock``): no measurement starts that would
    end past it (the hard cap, :attr:`VerifyOptions.deadline_s`)."""
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
    """Raise :class:`_TooSlow` where the first measurement (of plan ``first``, ``seconds``)
    says the first rounds of every plan would not fit the stretched budget."""
    sharing = m.shared is not None
    unit_s = unit_seconds(m.task, m.plans[first], seconds, sharing)
    if first_rounds_seconds(m.task, m.plans, rounds, unit_s, sharing) > budget_s * BUDGET_STRETCH:
        raise _TooSlow(seconds, unit_s)


class _OutOfTime(Exception):
    """The verification's budget ends before the next measurement would."""


class _TooSlow(Exception):
    """The first measurement says the first rounds of every plan would not fit even the
    stretched budget."""

    def __init__(self, seconds: float, unit_s: float) -> None:
        super().__init__(f"one measurement took {seconds:.1f} s")
        self.seconds, self.unit_s = seconds, unit_s
