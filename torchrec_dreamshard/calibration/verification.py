"""Verification: the best-rated candidate plans and every classic heuristic's plan
measured on real kernels in interleaved rounds. The fastest heuristic plan (lowest median
measured step) is the reference; another plan replaces it only if it measured faster than
the reference in every round (rounds pair up: each visits every plan once), and among
those the lowest median wins. One lucky round cannot pick a plan slower than the best
heuristic's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from torchrec_dreamshard.data.tasks import NoPlanError, Task
from torchrec_dreamshard.measure.config import MeasureConfig

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy import PlacementAgent


@dataclass
class VerifiedPlan:
    """One plan measured by :func:`verify`."""

    name: str
    placement: list[int]
    predicted_ms: float
    log_std: float
    measured_ms: float = float("nan")  # median over rounds of the measured step
    rounds_ms: list[float] = field(default_factory=list)
    heuristic: bool = False  # a classic heuristic's plan (the reference)


@dataclass
class VerifyResult:
    """The plans :func:`verify` measured, the chosen first (see :func:`rank_measured`),
    and the time it took."""

    plans: list[VerifiedPlan]
    seconds: float
    cached: bool = False  # the rounds were read from this machine's cache

    @property
    def winner(self) -> VerifiedPlan:
        return self.plans[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "winner": self.winner.name,
            "seconds": self.seconds,
            "cached": self.cached,
            "plans": [
                {
                    "name": p.name,
                    "predicted_ms": p.predicted_ms,
                    "measured_ms": p.measured_ms,
                    "rounds_ms": p.rounds_ms,
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


@dataclass(frozen=True)
class VerificationSettings:
    """How :func:`verify` measures: the settings a plan's verification travels with.

    Attributes:
        k: the best-rated candidate plans measured beside the heuristics' (0: no
            verification).
        rounds: interleaved rounds.
        config: the measurement's settings (``None``: :class:`MeasureConfig`'s, or the
            calibration's where a caller has one).
        budget_s: measure no plan that would end past this many seconds (``None``: all
            ``rounds``).
        cache: read and write the rounds in this machine's cache.
        incumbent: the name of the plan that stands unless another measured faster in
            every round (``None``: the fastest heuristic's).
    """

    k: int = 0
    rounds: int = 3
    config: MeasureConfig | None = None
    budget_s: float | None = None
    cache: bool = False
    incumbent: str | None = None

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"verify must be >= 0 candidate plans, got {self.k}")


def verify_candidates(
    agent: PlacementAgent,
    task: Task,
    k: int,
    extra: Mapping[str, Sequence[int]] | None = None,
) -> list[VerifiedPlan]:
    """The ``extra`` plans, the ``k`` best-rated distinct plans of the agent's last
    safety-net report (run ``agent.place`` first) and every heuristic's plan, named, with
    their predictions."""
    from torchrec_dreamshard.policy.heuristics import HEURISTICS, proxy_greedy

    report = agent.last_report
    named: dict[tuple[int, ...], str] = {}
    for name, p in (extra or {}).items():
        named.setdefault(tuple(int(d) for d in p), name)
    if report is not None:
        for c in report.candidates:
            if len(named) >= k:  # the extra plans count among the k
                break
            named.setdefault(tuple(int(d) for d in c.placement), c.label)
    heuristic: set[tuple[int, ...]] = set()
    for h, proxy in HEURISTICS.items():
        try:
            p = tuple(proxy_greedy(task, proxy))
        except NoPlanError:
            continue
        heuristic.add(p)
        if p in named:
            named[p] = f"{named[p]}={h}"
        else:
            named[p] = f"heuristic:{h}"
    out = []
    for p, name in named.items():
        pred = agent.predict(task, list(p))
        out.append(
            VerifiedPlan(name, list(p), pred.step_ms, pred.step_log_std, heuristic=p in heuristic)
        )
    return out


MIN_ROUNDS_TO_REPLACE = 2  # rounds a plan must win before it replaces a named incumbent


def rank_measured(
    plans: Sequence[VerifiedPlan], incumbent: str | None = None
) -> list[VerifiedPlan]:
    """``plans`` (measured: ``rounds_ms`` filled, one entry per round, the same number
    for every plan) winner first, then by median measured step.

    The winner is the incumbent unless other plans measured faster than it in every
    round; then the fastest of those by median. The incumbent is the plan named
    ``incumbent`` where given (the planner's own choice, which then stands unless the
    measurement says otherwise every time, over at least :data:`MIN_ROUNDS_TO_REPLACE`
    rounds: one round is one draw of the noise), else the fastest heuristic plan by
    median (the model's plans must then beat the heuristics every time). Without either,
    the fastest by median."""
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


def verify(
    agent: PlacementAgent,
    task: Task,
    settings: VerificationSettings | None = None,
    progress: bool = False,
    extra: Mapping[str, Sequence[int]] | None = None,
) -> VerifyResult:
    """Measure the ``k`` best-rated candidates and the heuristics' plans (see
    :func:`verify_candidates`; ``extra`` adds named plans) in ``rounds`` interleaved
    rounds (:func:`~torchrec_dreamshard.measure.measure_in_rounds`: each round visits every
    plan once, the order rotated round by round); the plans winner first (see
    :func:`rank_measured`), then by median measured step cost.

    Args:
        settings: how many candidates (``k``, default 4), ``rounds``, the measurement's
            ``config``, ``budget_s``, ``cache`` and ``incumbent`` (see
            :class:`VerificationSettings` and below).
        budget_s: measure no plan that would end past this many seconds (at the mean time
            a measurement took so far); a round cut short is dropped, and where no round is
            whole the incumbent stands (``None``: all ``rounds``).
        cache: read the rounds of these very plans of this task from this machine's
            cache, or write them there once measured (:func:`verification_cache_path`),
            so that planning the same tables again measures nothing.
        incumbent: the name of the plan (an ``extra`` one) that stands unless another
            measured faster in every round (``None``: the fastest heuristic's; see
            :func:`rank_measured`).

    Raises:
        RuntimeError: a measurement failed (its error is named).
    """
    from torchrec_dreamshard.measure import measure_in_rounds, measure_placement

    settings = settings if settings is not None else VerificationSettings(k=4)
    k, config, rounds = settings.k, settings.config, settings.rounds
    budget_s, cache, incumbent = settings.budget_s, settings.cache, settings.incumbent
    if k < 1 or rounds < 1:
        raise ValueError(f"verify needs k >= 1 and rounds >= 1, got {k}, {rounds}")
    start = time.perf_counter()
    config = replace(config or MeasureConfig(), rounds=1)
    plans = verify_candidates(agent, task, k, extra)
    path = verification_cache_path(task, plans, config, rounds) if cache else None
    if path is not None and _read_rounds(path, plans):
        return VerifyResult(
            rank_measured(plans, incumbent), time.perf_counter() - start, cached=True
        )
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=rounds * len(plans), desc="verify: measuring plans", leave=False)

    took: list[float] = []  # seconds of each measurement so far

    def measure(_: int, i: int) -> float:
        now = time.perf_counter()
        if budget_s is not None and now + float(np.mean(took or [0.0])) > start + budget_s:
            raise _OutOfTime
        m = measure_placement(task, plans[i].placement, config)
        if not m.ok:
            raise RuntimeError(f"verification of plan {plans[i].name} failed: {m.error}")
        took.append(time.perf_counter() - now)
        if bar is not None:
            bar.update(1)
        return float(m.step_ms)

    done: list[dict[int, float]] = []
    try:
        for r in range(rounds):
            done = measure_in_rounds([list(range(len(plans)))], measure, r + 1, done=[done])[0]
    except _OutOfTime:
        pass  # the round cut short is not in ``done``
    finally:
        if bar is not None:
            bar.close()
    for results in done:
        for i, ms in results.items():
            plans[i].rounds_ms.append(ms)
    if path is not None:
        _write_rounds(path, plans)
    return VerifyResult(rank_measured(plans, incumbent), time.perf_counter() - start)


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


def _read_rounds(path: Path, plans: Sequence[VerifiedPlan]) -> bool:
    """Fill ``plans``' rounds from ``path``; ``False`` (and nothing filled) when the file
    is missing or does not hold exactly these plans."""
    from torchrec_dreamshard.io import read_json

    if not path.exists():
        return False
    data = read_json(path, "verification cache")
    stored = data.get("plans") if isinstance(data, dict) else None
    if not isinstance(stored, list) or len(stored) != len(plans):
        return False
    for p, s in zip(plans, stored, strict=True):
        if not isinstance(s, dict) or s.get("placement") != p.placement:
            return False
        if not isinstance(s.get("rounds_ms"), list):
            return False
    if len({len(s["rounds_ms"]) for s in stored}) != 1:
        return False
    for p, s in zip(plans, stored, strict=True):
        p.rounds_ms = [float(ms) for ms in s["rounds_ms"]]
    return True


def _write_rounds(path: Path, plans: Sequence[VerifiedPlan]) -> None:
    from torchrec_dreamshard.io import atomic_write, dumps_strict

    data = {"plans": [{"placement": p.placement, "rounds_ms": p.rounds_ms} for p in plans]}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, dumps_strict(data), "verification cache")
