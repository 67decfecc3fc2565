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
from typing import TYPE_CHECKING, Any

import numpy as np

from torchrec_dreamshard.data.tasks import Task
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

    @property
    def winner(self) -> VerifiedPlan:
        return self.plans[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "winner": self.winner.name,
            "seconds": self.seconds,
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
        out = [
            f"verification: {len(self.plans)} plans measured in {rounds} interleaved rounds "
            f"({self.seconds:.1f}s); chosen: {self.winner.name}",
            f"  {'plan':30s} {'predicted ms':>12s} {'measured ms':>12s} {'error':>7s}",
        ]
        for p in self.plans:
            err = (p.predicted_ms / p.measured_ms - 1.0) * 100.0
            out.append(f"  {p.name:30s} {p.predicted_ms:12.3f} {p.measured_ms:12.3f} {err:+6.1f}%")
        return out


def verify_candidates(
    agent: PlacementAgent,
    task: Task,
    k: int,
    seed: int = 0,
    extra: Mapping[str, Sequence[int]] | None = None,
) -> list[VerifiedPlan]:
    """The ``extra`` plans, the ``k`` best-rated distinct plans of the agent's last
    safety-net report (run ``agent.place`` first) and every heuristic's plan, named, with
    their predictions."""
    from torchrec_dreamshard.planner import baselines

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
    for h in baselines.HEURISTICS:
        try:
            p = tuple(baselines.place(h, task, seed=seed))
        except baselines.NoPlanError:
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


def rank_measured(plans: Sequence[VerifiedPlan]) -> list[VerifiedPlan]:
    """``plans`` (measured: ``rounds_ms`` filled, one entry per round) winner first, then
    by median measured step. The winner is the fastest heuristic plan by median unless
    other plans measured faster than it in every round; then the fastest of those by
    median. Without a heuristic plan, the fastest by median."""
    for p in plans:
        p.measured_ms = float(np.median(p.rounds_ms))
    ordered = sorted(plans, key=lambda p: p.measured_ms)
    heur = [p for p in ordered if p.heuristic]
    if not heur:
        return ordered
    ref = heur[0]

    def beats(p: VerifiedPlan) -> bool:
        return all(a < b for a, b in zip(p.rounds_ms, ref.rounds_ms, strict=True))

    winner = next((p for p in ordered if p is ref or beats(p)), ref)
    return [winner, *(p for p in ordered if p is not winner)]


def verify(
    agent: PlacementAgent,
    task: Task,
    k: int = 4,
    config: MeasureConfig | None = None,
    rounds: int = 3,
    seed: int = 0,
    progress: bool = False,
    extra: Mapping[str, Sequence[int]] | None = None,
) -> VerifyResult:
    """Measure the ``k`` best-rated candidates and the heuristics' plans (see
    :func:`verify_candidates`; ``extra`` adds named plans) in ``rounds`` interleaved
    rounds (:func:`~torchrec_dreamshard.measure.measure_in_rounds`: each round visits every
    plan once, the order rotated round by round); the plans winner first (see
    :func:`rank_measured`), then by median measured step cost.

    Raises:
        RuntimeError: a measurement failed (its error is named).
    """
    from torchrec_dreamshard.measure import measure_in_rounds, measure_placement

    if k < 1 or rounds < 1:
        raise ValueError(f"verify needs k >= 1 and rounds >= 1, got {k}, {rounds}")
    start = time.perf_counter()
    config = replace(config or MeasureConfig(), rounds=1)
    plans = verify_candidates(agent, task, k, seed, extra)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=rounds * len(plans), desc="verify: measuring plans", leave=False)

    def measure(_: int, i: int) -> float:
        m = measure_placement(task, plans[i].placement, config)
        if not m.ok:
            raise RuntimeError(f"verification of plan {plans[i].name} failed: {m.error}")
        if bar is not None:
            bar.update(1)
        return float(m.step_ms)

    try:
        measured = measure_in_rounds([list(range(len(plans)))], measure, rounds)[0]
    finally:
        if bar is not None:
            bar.close()
    for results in measured:
        for i, ms in results.items():
            plans[i].rounds_ms.append(ms)
    return VerifyResult(rank_measured(plans), time.perf_counter() - start)
