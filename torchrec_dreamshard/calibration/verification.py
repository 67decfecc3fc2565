"""Verification: the best-rated candidate plans, every classic heuristic's plan and
TorchRec's own plan for the same tables measured on real kernels in interleaved rounds.

Which plan is kept (:func:`rank_measured`):

1. the incumbent (the planner's own choice where named, else the fastest heuristic plan by
   median measured step) stands unless other plans measured faster than it in every round;
   then the fastest of those by median. One lucky round cannot pick a slower plan.
2. Where TorchRec's plan was measured (a *baseline*: the plan the user had before the
   swap), the kept plan must beat it beyond the noise (:func:`beats_beyond_noise`: faster
   in enough rounds for a one-sided sign test at :data:`~.noise.SIGN_ALPHA`, and by
   median); else the fastest plan that does, else TorchRec's own. So the kept plan never
   measured slower than TorchRec's in the same rounds.

A busy machine (:class:`~.noise.Noise`): the reference kernel is timed before and after
the rounds, and each plan's rounds are compared. When the rounds disagree (median relative
spread over :data:`~.noise.SPREAD_LIMIT`) or the reference drifted (over
:data:`~.noise.DRIFT_LIMIT`), the plans are measured again (as many rounds, within as much
budget again: see :class:`~.noise.NoiseLimits`) and those rounds decide if they are quiet.
If they are noisy too, the safer plan is kept (TorchRec's, else the fastest heuristic's)
and the result says so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from torchrec_dreamshard.calibration.noise import Noise, NoiseLimits, sign_test_wins
from torchrec_dreamshard.data.tasks import NoPlanError, Task
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.progress import progress_bar

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy import PlacementAgent

MIN_ROUNDS_TO_REPLACE = 2  # rounds a plan must win before it replaces a named incumbent


@dataclass
class VerifiedPlan:
    """One plan measured by :func:`verify`."""

    name: str
    placement: list[int]
    predicted_ms: float
    log_std: float
    measured_ms: float = float("nan")  # median over rounds of the measured step
    rounds_ms: list[float] = field(default_factory=list)
    earlier_ms: list[float] = field(default_factory=list)  # a noisy first pass's rounds
    heuristic: bool = False  # a classic heuristic's plan (the reference)
    baseline: bool = False  # TorchRec's plan: the kept plan must not measure slower


@dataclass
class VerifyResult:
    """The plans :func:`verify` measured, the kept first (see :func:`rank_measured`), the
    time it took and how noisy its passes were.

    Attributes:
        plans: the plans, the kept first; their ``rounds_ms`` are the deciding pass's.
        seconds: wall time.
        cached: the rounds were read from this machine's cache.
        passes: each pass's noise (a second where the first was noisy).
        fallback: why the safer plan was kept regardless of the ranking (``None``: not).
    """

    plans: list[VerifiedPlan]
    seconds: float
    cached: bool = False
    passes: list[Noise] = field(default_factory=list)
    fallback: str | None = None

    @property
    def winner(self) -> VerifiedPlan:
        return self.plans[0]

    @property
    def baseline(self) -> VerifiedPlan | None:
        """TorchRec's plan, where it was measured."""
        return next((p for p in self.plans if p.baseline), None)

    @property
    def best_heuristic(self) -> VerifiedPlan | None:
        """The heuristic plan of lowest median measured step (``None``: none measured)."""
        heur = [p for p in self.plans if p.heuristic and p.rounds_ms]
        return min(heur, key=lambda p: p.measured_ms) if heur else None

    def margins(self) -> dict[str, Any]:
        """The kept plan's median measured step over TorchRec's plan's and over the best
        heuristic's (``None`` where not measured)."""

        def ratio(other: VerifiedPlan | None) -> float | None:
            if other is None or not other.rounds_ms or not self.winner.rounds_ms:
                return None
            return self.winner.measured_ms / other.measured_ms

        return {
            "kept": self.winner.name,
            "vs_torchrec": ratio(self.baseline),
            "vs_best_heuristic": ratio(self.best_heuristic),
            "measured": bool(self.winner.rounds_ms),
        }

    def summary(self, describe: Callable[[str], str] | None = None) -> str:
        """One line: what was measured, in how long, what was kept and by how much, e.g.
        ``verified 6 plans in 8.5 s: kept the policy's plan, 4.1% faster than TorchRec's
        and 2.3% faster than the best heuristic's, measured``. ``describe`` names a plan
        for people (default :func:`plan_words`)."""
        describe = describe or plan_words
        how = "read from this machine's cache" if self.cached else f"in {self.seconds:.1f} s"
        rounds = len(self.winner.rounds_ms)
        head = f"verified {len(self.plans)} plans {how} ({rounds} rounds): kept "
        head += describe(self.winner.name)
        m = self.margins()
        parts = []
        if m["vs_torchrec"] is not None and not self.winner.baseline:
            parts.append(f"{percent(m['vs_torchrec'])} TorchRec's")
        best = self.best_heuristic
        if m["vs_best_heuristic"] is not None and best is not self.winner:
            parts.append(f"{percent(m['vs_best_heuristic'])} the best heuristic's")
        line = head + (", " + " and ".join(parts) + ", measured" if parts else "")
        if not rounds:
            line += " (no whole round fitted in the budget)"
        if len(self.passes) > 1:
            line += f"; the first rounds were noisy ({self.passes[0].describe()}): measured again"
        if self.fallback:
            line += f"; {self.fallback}"
        return line

    def to_dict(self) -> dict[str, Any]:
        return {
            "winner": self.winner.name,
            "seconds": self.seconds,
            "cached": self.cached,
            "passes": [n.to_dict() for n in self.passes],
            "fallback": self.fallback,
            "margins": self.margins(),
            "plans": [
                {
                    "name": p.name,
                    "predicted_ms": p.predicted_ms,
                    "measured_ms": p.measured_ms,
                    "rounds_ms": p.rounds_ms,
                    "earlier_ms": p.earlier_ms,
                    "heuristic": p.heuristic,
                    "torchrec": p.baseline,
                }
                for p in self.plans
            ],
        }

    def lines(self) -> list[str]:
        rounds = len(self.winner.rounds_ms)
        how = "read from this machine's cache" if self.cached else f"({self.seconds:.1f}s)"
        out = [
            f"verification: {len(self.plans)} plans measured in {rounds} interleaved rounds "
            f"{how}; chosen: {self.winner.name}",
            f"  {'plan':30s} {'predicted ms':>12s} {'measured ms':>12s} {'error':>7s}",
        ]
        for p in self.plans:
            err = (p.predicted_ms / p.measured_ms - 1.0) * 100.0
            out.append(f"  {p.name:30s} {p.predicted_ms:12.3f} {p.measured_ms:12.3f} {err:+6.1f}%")
        return out


def percent(ratio: float) -> str:
    """``"4.1% faster than"`` for a ratio of 0.959, ``"2.0% slower than"`` for 1.02."""
    if ratio <= 1.0:
        return f"{(1.0 - ratio) * 100:.1f}% faster than"
    return f"{(ratio - 1.0) * 100:.1f}% slower than"


TORCHREC_WORDS = "TorchRec's plan"


def plan_words(name: str, chosen: str | None = None) -> str:
    """A measured plan's name for people: ``chosen`` (the planner's choice) as ``"the
    planner's plan (<its safety-net label>)"``, TorchRec's as ``"TorchRec's plan"``, a
    heuristic's as ``"the size_greedy heuristic's plan"``; a name that joins several
    (``chosen=torchrec_ours``) by its first."""
    first, *also = name.split("=")
    if first == "chosen":
        label = f" ({chosen})" if chosen else ""
        words = f"the planner's plan{label}"
    elif first.startswith("torchrec"):
        words = TORCHREC_WORDS
    elif first.startswith("heuristic:"):
        words = f"the {first.split(':', 1)[1]} heuristic's plan"
    else:
        words = f"the {first} plan"
    if any(a.startswith("torchrec") for a in also):
        words += ", the same as TorchRec's"
    return words


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


def beats_beyond_noise(p: VerifiedPlan, ref: VerifiedPlan) -> bool:
    """Whether ``p`` measured faster than ``ref`` beyond the noise: a lower median, and
    faster in enough of their paired rounds for the sign test (:func:`sign_test_wins`)."""
    n = min(len(p.rounds_ms), len(ref.rounds_ms))
    need = sign_test_wins(n)
    if need is None or not np.median(p.rounds_ms) < np.median(ref.rounds_ms):
        return False
    return sum(a < b for a, b in zip(p.rounds_ms, ref.rounds_ms, strict=False)) >= need


def rank_measured(
    plans: Sequence[VerifiedPlan], incumbent: str | None = None
) -> list[VerifiedPlan]:
    """``plans`` (measured: ``rounds_ms`` filled, one entry per round, the same number
    for every plan) kept plan first, then by median measured step.

    The kept plan is the incumbent unless other plans measured faster than it in every
    round; then the fastest of those by median. The incumbent is the plan named
    ``incumbent`` where given (the planner's own choice, which then stands unless the
    measurement says otherwise every time, over at least :data:`MIN_ROUNDS_TO_REPLACE`
    rounds: one round is one draw of the noise), else the fastest heuristic plan by
    median (the model's plans must then beat the heuristics every time). Without either,
    the fastest by median. Then, where a baseline (TorchRec's plan) is among ``plans``,
    a kept plan that does not beat it beyond the noise (:func:`beats_beyond_noise`)
    gives way to the fastest plan that does, else to the baseline itself."""
    ranked = _rank_incumbent(plans, incumbent)
    base = next((p for p in ranked if p.baseline), None)
    if base is None or ranked[0] is base or beats_beyond_noise(ranked[0], base):
        return ranked
    kept = next((p for p in ranked[1:] if p is not base and beats_beyond_noise(p, base)), base)
    return [kept, *(p for p in ranked if p is not kept)]


def _rank_incumbent(
    plans: Sequence[VerifiedPlan], incumbent: str | None = None
) -> list[VerifiedPlan]:
    """:func:`rank_measured` before its baseline rule."""
    rounds = min((len(p.rounds_ms) for p in plans), default=0)
    for p in plans:
        p.measured_ms = float(np.median(p.rounds_ms)) if p.rounds_ms else float("nan")
    ordered = sorted(plans, key=lambda p: p.measured_ms) if rounds else list(plans)
    if incumbent is not None:
        named = [p for p in ordered if p.name == incumbent or p.name.startswith(f"{incumbent}=")]
        if not named:
            raise ValueError(f"no measured plan is named {incumbent!r}")
        ref = named[0]
        if rounds < MIN_ROUNDS_TO_REPLACE:
            return [ref, *(p for p in ordered if p is not ref)]
    else:
        heur = [p for p in ordered if p.heuristic]
        if not heur:
            return ordered
        ref = heur[0]
        if not rounds:
            return [ref, *(p for p in ordered if p is not ref)]

    def beats(p: VerifiedPlan) -> bool:
        return all(a < b for a, b in zip(p.rounds_ms, ref.rounds_ms, strict=True))

    winner = next((p for p in ordered if p is ref or beats(p)), ref)
    return [winner, *(p for p in ordered if p is not winner)]


def safer_plan(plans: Sequence[VerifiedPlan]) -> VerifiedPlan | None:
    """The plan kept when the measurements are too noisy to rank: TorchRec's plan where it
    was measured, else the fastest heuristic's by median (``None``: neither)."""
    base = next((p for p in plans if p.baseline), None)
    if base is not None:
        return base
    heur = [p for p in plans if p.heuristic]
    if not heur:
        return None
    return min(heur, key=lambda p: p.measured_ms if p.rounds_ms else math.inf)


def keep(
    plans: Sequence[VerifiedPlan], incumbent: str | None, passes: Sequence[Noise]
) -> tuple[list[VerifiedPlan], str | None]:
    """:func:`rank_measured`; then, where the last pass was noisy, the safer plan
    (:func:`safer_plan`) unless a plan measured faster than it in every round of every
    pass (at least 3: on a busy machine only a plan that wins every pairing counts as
    faster); and why (``None``: the ranking stands)."""
    ranked = rank_measured(plans, incumbent)
    if not passes or not passes[-1].noisy:
        return ranked, None
    safer = safer_plan(ranked)
    if safer is None:
        return ranked, None

    def every_round(p: VerifiedPlan) -> bool:
        mine, theirs = p.earlier_ms + p.rounds_ms, safer.earlier_ms + safer.rounds_ms
        if len(mine) < 3 or len(mine) != len(theirs):
            return False
        return all(a < b for a, b in zip(mine, theirs, strict=True))

    winners = [p for p in ranked if p is not safer and every_round(p)]
    kept = min(winners, key=lambda p: p.measured_ms) if winners else safer
    again = " again" if len(passes) > 1 else ""
    why = f"the measurements were noisy{again} ({passes[-1].describe()}): kept "
    if kept is safer:
        why += f"{plan_words(safer.name)}, the safer plan"
    else:
        n = len(kept.earlier_ms + kept.rounds_ms)
        why += f"a plan faster than {plan_words(safer.name)} in every one of {n} rounds"
    return [kept, *(p for p in ranked if p is not kept)], why


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
            cache, or write them there once measured (:func:`verification_cache_path`).
        incumbent: the name of the plan (an ``extra`` one) that stands unless another
            measured faster in every round (``None``: the fastest heuristic's).
        progress: a progress bar (see :func:`progress_bar`).
        noise: when the measurements count as noisy (:class:`NoiseLimits`).
    """

    rounds: int = 3
    budget_s: float | None = None
    cache: bool = False
    incumbent: str | None = None
    progress: bool = False
    noise: NoiseLimits = field(default_factory=NoiseLimits)


@dataclass(frozen=True)
class Timing:
    """What :func:`verify` measures with: ``step_ms(task, placement)``, one measured step
    of a plan, and ``reference_ms()``, the reference kernel now (``None``: not timed).
    :func:`kernel_timing` gives the real kernels'; tests pass others."""

    step_ms: Callable[[Task, list[int]], float]
    reference_ms: Callable[[], float] | None = None


def kernel_timing(config: MeasureConfig) -> Timing:
    """Real FBGEMM kernels: :func:`~torchrec_dreamshard.measure.measure_placement` with
    ``config``, and the reference kernel's fwd + bwd
    (:func:`~torchrec_dreamshard.measure.reference_speed.measure_reference_ms`)."""

    def step_ms(task: Task, placement: list[int]) -> float:
        import torchrec_dreamshard.measure as measure

        m = measure.measure_placement(task, placement, config)
        if not m.ok:
            raise RuntimeError(str(m.error))
        return float(m.step_ms)

    def reference_ms() -> float:
        from torchrec_dreamshard.measure.reference_speed import measure_reference_ms

        return float(sum(measure_reference_ms(config.device)))

    return Timing(step_ms, reference_ms)


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
    interleaved rounds (:func:`~torchrec_dreamshard.measure.measure_in_rounds`: each round
    visits every plan once, the order rotated round by round), with the reference kernel
    timed before and after; where that pass was noisy, a second (see the module
    docstring). The plans kept first (:func:`keep`), then by median measured step.

    Args:
        config: the measurement settings (one timing round per measurement).
        options: rounds, budget, cache, incumbent, progress and noise limits.
        timing: what measures (default :func:`kernel_timing`).

    Raises:
        RuntimeError: a measurement failed (the plan and its error are named).
    """
    options = options or VerifyOptions()
    if k < 1 or options.rounds < 1:
        raise ValueError(f"verify needs k >= 1 and rounds >= 1, got {k}, {options.rounds}")
    start = time.perf_counter()
    config = replace(config or MeasureConfig(), rounds=1)
    plans = verify_candidates(agent, task, k, extra, baselines)
    path = verification_cache_path(task, plans, config, options.rounds) if options.cache else None
    if path is not None:
        passes = _read_rounds(path, plans)
        if passes is not None:
            ranked, why = keep(plans, options.incumbent, passes)
            took = time.perf_counter() - start
            return VerifyResult(ranked, took, cached=True, passes=passes, fallback=why)
    rounds, passes = _measure_passes(task, plans, options, timing or kernel_timing(config))
    for i, p in enumerate(plans):  # the last pass decides; a noisy first is kept apart
        p.rounds_ms = [r[i] for r in rounds[-1]]
        p.earlier_ms = [r[i] for r in rounds[0]] if len(rounds) > 1 else []
    if path is not None:
        _write_rounds(path, plans, passes)
    ranked, why = keep(plans, options.incumbent, passes)
    return VerifyResult(ranked, time.perf_counter() - start, passes=passes, fallback=why)


def _measure_passes(
    task: Task, plans: Sequence[VerifiedPlan], options: VerifyOptions, timing: Timing
) -> tuple[list[list[dict[int, float]]], list[Noise]]:
    """Every pass's rounds (``{plan index: ms}`` each) and noise: the first pass, and
    where it was noisy a second (when it measured a whole round), which decides."""
    limits = options.noise
    reference = timing.reference_ms if math.isfinite(limits.drift) else None
    extra = options.rounds if limits.extra_rounds is None else limits.extra_rounds
    bar = progress_bar(options.rounds * len(plans), "verify: measuring plans", options.progress)
    try:
        before = reference() if reference is not None else None
        rounds = [_one_pass(task, plans, options.rounds, options.budget_s, timing, bar)]
        after = reference() if reference is not None else None
        passes = [Noise.of(rounds[0], (before, after), limits)]
        if passes[0].noisy and extra > 0 and rounds[0]:
            if bar is not None:
                bar.total += extra * len(plans)
                bar.set_description("verify: noisy, measuring again")
            budget = None if options.budget_s is None else options.budget_s * limits.extra_budget
            more = _one_pass(task, plans, extra, budget, timing, bar)
            if more:
                again = reference() if reference is not None else None
                passes.append(Noise.of(more, (after, again), limits))
                rounds.append(more)
    finally:
        if bar is not None:
            bar.close()
    return rounds, passes


def _one_pass(
    task: Task,
    plans: Sequence[VerifiedPlan],
    rounds: int,
    budget_s: float | None,
    timing: Timing,
    bar: Any,
) -> list[dict[int, float]]:
    """``rounds`` interleaved rounds of every plan within ``budget_s`` (whole rounds only)."""
    from torchrec_dreamshard.measure import measure_in_rounds

    start = time.perf_counter()
    took: list[float] = []  # seconds of each measurement so far

    def measure(_: int, i: int) -> float:
        now = time.perf_counter()
        if budget_s is not None and now + float(np.mean(took or [0.0])) > start + budget_s:
            raise _OutOfTime
        try:
            ms = timing.step_ms(task, plans[i].placement)
        except RuntimeError as exc:
            raise RuntimeError(f"verification of plan {plans[i].name} failed: {exc}") from exc
        took.append(time.perf_counter() - now)
        if bar is not None:
            bar.update(1)
        return float(ms)

    done: list[dict[int, float]] = []
    try:
        for r in range(rounds):
            done = measure_in_rounds([list(range(len(plans)))], measure, r + 1, done=[done])[0]
    except _OutOfTime:
        pass  # the round cut short is not in ``done``
    return done


class _OutOfTime(Exception):
    """The verification's budget ends before the next measurement would."""


def verification_cache_path(
    task: Task, plans: Sequence[VerifiedPlan], config: MeasureConfig, rounds: int
) -> Path:
    """This machine's cache file of the verification of ``plans`` of ``task`` (the tables,
    devices, memory and batch, the plans' placements, the measurement's settings)."""
    from torchrec_dreamshard.measure.config import stable_key
    from torchrec_dreamshard.measure.hardware import device_name
    from torchrec_dreamshard.measure.machine_cache import machine_cache_path

    key = stable_key(
        [task.to_dict(), [p.placement for p in plans], config.to_dict(), rounds], length=16
    )
    device = config.device
    return machine_cache_path(f"verification_{device}_{key}", device_name(device))


def _read_rounds(path: Path, plans: Sequence[VerifiedPlan]) -> list[Noise] | None:
    """Fill ``plans``' rounds from ``path`` and return its passes' noise; ``None`` (and
    nothing filled) when the file is missing or does not hold exactly these plans."""
    from torchrec_dreamshard.io import read_json

    if not path.exists():
        return None
    data = read_json(path, "verification cache")
    stored = data.get("plans") if isinstance(data, dict) else None
    if not isinstance(stored, list) or len(stored) != len(plans):
        return None
    for p, s in zip(plans, stored, strict=True):
        if not isinstance(s, dict) or s.get("placement") != p.placement:
            return None
        if not isinstance(s.get("rounds_ms"), list):
            return None
    if len({len(s["rounds_ms"]) for s in stored}) != 1:
        return None
    try:
        passes = [Noise.from_dict(n) for n in data.get("passes", [])]
    except (KeyError, TypeError):
        return None
    for p, s in zip(plans, stored, strict=True):
        p.rounds_ms = [float(ms) for ms in s["rounds_ms"]]
        p.earlier_ms = [float(ms) for ms in s.get("earlier_ms", [])]
    return passes


def _write_rounds(path: Path, plans: Sequence[VerifiedPlan], passes: Sequence[Noise]) -> None:
    from torchrec_dreamshard.io import atomic_write, dumps_strict

    data = {
        "plans": [
            {"placement": p.placement, "rounds_ms": p.rounds_ms, "earlier_ms": p.earlier_ms}
            for p in plans
        ],
        "passes": [{k: v for k, v in n.to_dict().items() if k != "noisy"} for n in passes],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, dumps_strict(data), "verification cache")
