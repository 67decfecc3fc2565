"""The plans a verification measures (:func:`verify_candidates`), named."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from torchrec_dreamshard.data.tasks import NoPlanError, Task
from torchrec_dreamshard.verification.verify_result import VerifiedPlan

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy import PlacementAgent


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
    """The ``extra`` plans, the ``k`` best-rated distinct plans, the ``baselines`` and every
    heuristic's plan, named; a plan proposed twice joins its names (``chosen=torchrec_ours``)."""
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
