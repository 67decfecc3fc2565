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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from torchrec_dreamshard.data.tasks import NoPlanError, Task
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.guard import warn_failures
from torchrec_dreamshard.measure.progress import progress_bar
from torchrec_dreamshard.measure.rounds import measure_in_rounds
from torchrec_dreamshard.verification.noise import Noise, NoiseLimits
from torchrec_dreamshard.verification.plan_ranking import keep, measuring_priority
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


MIN_ROUNDS = 3  # rounds a pass may stretch its budget for (a sign test needs 3)
BUDGET_STRETCH = 3.0  # ... up to this many times the budget
FIT_HEADROOM = 0.8  # a slow task measures the plans whose rounds fill this much of it
MIN_PLANS = 3  # ... and at least these: the planner's choice, TorchRec's, a heuristic's


def heuristic_plans(task: Task) -> dict[str, tuple[int, ...]]:
    """Every classic heuristic's plan of ``task`` by heuristic name (those that find one)."""
    from torchrec_dreamshard.policy.heuristics import HEURISTICS, proxy_greedy

    out = {}
    for h, proxy in HEURISTICS.items():
        try:
            out[h] = tuple(proxy_greedy(task, proxy))
        except NoPlanError:
            continue
    return out


def verify_candidates(
    agent: PlacementAgent,
    task: Task,
    k: int,
    extra: Mapping[str, Sequence[int]] | None = None,
    baselines: Mapping[str, Sequence[int]] | None = None,
) -> list[VerifiedPlan]:
    """The ``extra`` plans, the ``k`` best-rated distinct plans of the agent's last
    safety-net report (run ``agent.place`` first), the ``baselines`` (TorchRec's plan,
    not counted among the ``k``) and every heuristic's plan, named, with their
    predictions. A plan proposed twice keeps its first name and gains the others'
    (``chosen=torchrec_ours``)."""
    report = agent.last_report
    named: dict[tuple[int, ...], str] = {}
    for name, p in (extra or {}).items():
        named.setdefault(tuple(int(d) for d in p), name)
    if report is not None:
        for c in report.candidates:
            if len(named) >= k:  # the extra plans count among the k
                break
            named.setdefault(tuple(int(d) for d in c.placement), c.label)
    base: set[tuple[int, ...]] = set()
    for name, p in (baselines or {}).items():
        key = tuple(int(d) for d in p)
        base.add(key)
        named[key] = f"{named[key]}={name}" if key in named else name
    heuristic: set[tuple[int, ...]] = set()
    for h, p in heuristic_plans(task).items():
        heuristic.add(p)
        named[p] = f"{named[p]}={h}" if p in named else f"heuristic:{h}"
    out = []
    for p, name in named.items():
        pred = agent.predict(task, list(p))
        plan = VerifiedPlan(name, list(p), pred.step_ms, pred.step_log_std)
        plan.heuristic, plan.baseline = p in heuristic, p in base
        out.append(plan)
    return out


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
    """

    rounds: int = 3
    budget_s: float | None = None
    cache: bool = False
    incumbent: str | None = None
    progress: bool = False
    noise: NoiseLimits = field(default_factory=NoiseLimits)
    deadline_s: float | None = None


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
        measured, rounds, passes = _measure_passes(
            task, plans, options, timing or kernel_timing(config), config.device
        )
    except MeasuringFailed as failed:
        warn_failures([failed.failure], "the planner's chosen plan is kept, not measured")
        seconds = clock() - start
        return VerifyResult(list(plans), seconds, failure=failed.failure)
    for i, p in enumerate(measured):  # the last pass decides; a noisy first is kept apart
        p.rounds_ms = [r[i] for r in rounds[-1]]
        p.earlier_ms = [r[i] for r in rounds[0]] if len(rounds) > 1 else []
    if path is not None:
        write_rounds(path, plans, passes)
    return _result(plans, options, passes, clock() - start)


def _result(
    plans: Sequence[VerifiedPlan],
    options: VerifyOptions,
    passes: list[Noise],
    seconds: float,
    cached: bool = False,
) -> VerifyResult:
    """The plans kept and ranked (:func:`~.plan_ranking.keep`) among those measured; the
    plans a slow task left out (:func:`_too_slow_for_all`) after them."""
    measured = [p for p in plans if p.rounds_ms] or list(plans)
    left_out = [p for p in plans if all(p is not m for m in measured)]
    ranked, why = keep(measured, options.incumbent, passes)
    return VerifyResult(
        [*ranked, *left_out], seconds, cached, passes, fallback=why, left_out=len(left_out)
    )


def _measure_passes(
    task: Task,
    plans: Sequence[VerifiedPlan],
    options: VerifyOptions,
    timing: Timing,
    device: str = "cpu",
) -> tuple[list[VerifiedPlan], list[list[dict[int, float]]], list[Noise]]:
    """The plans measured (all, unless the task is too slow for all of them: see
    :func:`_too_slow_for_all`), every pass's rounds (``{index among them: ms}`` each) and
    noise: the first pass, and where it was noisy a second (when it measured a whole
    round), which decides. Every measurement is :func:`~torchrec_dreamshard.measure.guard.guarded`
    (on ``device``); the first that fails raises :class:`MeasuringFailed`."""
    limits = options.noise
    end = None if options.deadline_s is None else timing.clock() + options.deadline_s
    reference = None
    if timing.reference_ms is not None and math.isfinite(limits.drift):
        reference = guarded_reference(timing.reference_ms, device)
    timing = Timing(guarded_step(timing.step_ms, plans, device), timing.reference_ms, timing.clock)
    extra = options.rounds if limits.extra_rounds is None else limits.extra_rounds
    bar = progress_bar(options.rounds * len(plans), "verify: measuring plans", options.progress)
    try:
        before = reference() if reference is not None else None
        try:
            rounds = [
                _one_pass(task, plans, options.rounds, options.budget_s, timing, bar, True, end)
            ]
        except _TooSlow as slow:
            plans = _too_slow_for_all(plans, options, slow.seconds)
            if bar is not None:
                bar.reset(total=options.rounds * len(plans))
                bar.set_description(f"verify: a slow task, measuring {len(plans)} plans")
            rounds = [
                _one_pass(task, plans, options.rounds, options.budget_s, timing, bar, end=end)
            ]
        after = reference() if reference is not None else None
        passes = [Noise.of(rounds[0], (before, after), limits)]
        if passes[0].noisy and extra > 0 and rounds[0]:
            if bar is not None:
                bar.total += extra * len(plans)
                bar.set_description("verify: noisy, measuring again")
            budget = None if options.budget_s is None else options.budget_s * limits.extra_budget
            more = _one_pass(task, plans, extra, budget, timing, bar, end=end)
            if more:
                again = reference() if reference is not None else None
                passes.append(Noise.of(more, (after, again), limits))
                rounds.append(more)
    finally:
        if bar is not None:
            bar.close()
    return list(plans), rounds, passes


def _too_slow_for_all(
    plans: Sequence[VerifiedPlan], options: VerifyOptions, seconds: float
) -> list[VerifiedPlan]:
    """The plans measured where one measurement takes ``seconds`` and the first
    :data:`MIN_ROUNDS` rounds of all of them would not fit :data:`BUDGET_STRETCH` times the
    budget: as many as fit (at least :data:`MIN_PLANS`), in the order of
    :func:`~.plan_ranking.measuring_priority` (the planner's choice, TorchRec's plan, the
    heuristic plan predicted fastest, then by predicted step). Fewer plans measured in
    rounds a sign test can decide on say more than many plans measured in none."""
    budget = (options.budget_s or math.inf) * BUDGET_STRETCH * FIT_HEADROOM
    fit = int(budget // (min(MIN_ROUNDS, options.rounds) * seconds))
    order = measuring_priority(plans, options.incumbent)
    chosen = set(order[: max(MIN_PLANS, fit)])
    return [p for i, p in enumerate(plans) if i in chosen]


def _one_pass(
    task: Task,
    plans: Sequence[VerifiedPlan],
    rounds: int,
    budget_s: float | None,
    timing: Timing,
    bar: Any,
    probe: bool = False,
    end: float | None = None,
) -> list[dict[int, float]]:
    """``rounds`` interleaved rounds of every plan within ``budget_s`` (whole rounds only).

    The first :data:`MIN_ROUNDS` rounds (the fewest a sign test can decide on) may run on
    to :data:`BUDGET_STRETCH` times the budget: a budget that does not fit them (many
    devices, big tables) grows with the task rather than leave the plans unranked. With
    ``probe``, where the first measurement says those rounds of every plan would not fit
    even so, :class:`_TooSlow` is raised (with that measurement's seconds) for the caller
    to measure fewer plans. ``end`` (on ``timing.clock``): no measurement starts that
    would end past it (the hard cap, :attr:`VerifyOptions.deadline_s`)."""
    start = timing.clock()
    took: list[float] = []  # seconds of each measurement so far
    done: list[dict[int, float]] = []

    def measure(_: int, i: int) -> float:
        now = timing.clock()
        stretch = BUDGET_STRETCH if len(done) < min(MIN_ROUNDS, rounds) else 1.0
        limit = None if budget_s is None else start + budget_s * stretch
        expected = now + float(np.mean(took or [0.0]))
        if (limit is not None and expected > limit) or (end is not None and expected > end):
            raise _OutOfTime
        ms = timing.step_ms(task, plans[i].placement)
        took.append(timing.clock() - now)
        if bar is not None:
            bar.update(1)
        if probe and budget_s is not None and len(took) == 1 and len(plans) > MIN_PLANS:
            first_rounds = min(MIN_ROUNDS, rounds) * len(plans) * took[0]
            if first_rounds > budget_s * BUDGET_STRETCH:
                raise _TooSlow(took[0])
        return float(ms)

    try:
        for r in range(rounds):
            done[:] = measure_in_rounds([list(range(len(plans)))], measure, r + 1, done=[done])[0]
    except _OutOfTime:
        pass  # the round cut short is not in ``done``
    return done


class _OutOfTime(Exception):
    """The verification's budget ends before the next measurement would."""


class _TooSlow(Exception):
    """The first measurement says the first rounds of every plan would not fit even the
    stretched budget."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"one measurement took {seconds:.1f} s")
        self.seconds = seconds
