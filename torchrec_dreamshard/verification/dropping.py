"""Candidates clearly behind after a round drop out (:class:`Dropping`); TorchRec's plan, the
incumbent, the fastest heuristic's and the plan :func:`~.plan_ranking.keep` would keep now
never do."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from torchrec_dreamshard.verification.noise import Noise, NoiseLimits
from torchrec_dreamshard.verification.plan_ranking import keep, rank_measured
from torchrec_dreamshard.verification.verify_result import Dropped, VerifiedPlan

DROP_FROM_ROUND = 2  # rounds of a pass before a plan may drop out (a spread needs two)
DROP_SPREADS = 3.0  # behind the fastest by more than this many times the rounds' spread
DROP_FLOOR = 0.10  # ... and by more than this, however quiet the rounds


@dataclass
class Dropping:
    """Which plans dropped out so far, over every pass of one verification.

    Args:
        plans: the plans measured (indices in rounds refer to them).
        incumbent: the incumbent's name.
        enabled: ``False``: nothing drops out.
    """

    plans: Sequence[VerifiedPlan]
    incumbent: str | None = None
    enabled: bool = True
    dropped: dict[int, Dropped] = field(default_factory=dict)
    earlier: list[dict[int, float]] = field(default_factory=list)  # a first pass's rounds

    def active(self) -> list[int]:
        """The indices of the plans still measured."""
        return [i for i in range(len(self.plans)) if i not in self.dropped]

    def next_pass(self, rounds: Sequence[Mapping[int, float]]) -> None:
        """A pass ended with ``rounds``: the next one pools them as its earlier rounds."""
        self.earlier = [dict(r) for r in rounds]

    def after_round(self, rounds: Sequence[Mapping[int, float]], pass_index: int) -> None:
        """Drop the plans clearly behind after the pass's ``rounds`` so far."""
        if not self.enabled or len(rounds) < DROP_FROM_ROUND:
            return
        self.dropped.update(clearly_behind(self.plans, rounds, self, pass_index))


def clearly_behind(
    plans: Sequence[VerifiedPlan],
    rounds: Sequence[Mapping[int, float]],
    dropping: Dropping,
    pass_index: int,
) -> dict[int, Dropped]:
    """Indices of the plans that drop out after the last of ``rounds``."""
    active = sorted(rounds[-1])
    ms = {i: [r[i] for r in rounds] for i in active}
    spread = Noise.of([{i: r[i] for i in active} for r in rounds], (None, None), NoiseLimits())
    if math.isnan(spread.spread) or len(active) < 2:
        return {}
    limit = max(DROP_SPREADS * spread.spread, DROP_FLOOR)
    median = {i: float(np.median(v)) for i, v in ms.items()}
    fastest = min(active, key=lambda i: median[i])
    keeps = protected(plans, ms, dropping)
    out = {}
    for i in active:
        behind = median[i] / median[fastest] - 1.0 if median[fastest] > 0 else 0.0
        every = all(a > b for a, b in zip(ms[i], ms[fastest], strict=True))
        if i not in keeps and behind > limit and every:
            out[i] = Dropped(len(rounds), pass_index, behind, limit, plans[fastest].name)
    return out


def protected(
    plans: Sequence[VerifiedPlan], ms: Mapping[int, list[float]], dropping: Dropping
) -> set[int]:
    """The indices that never drop out (all of them where the named incumbent is not
    among ``ms``)."""
    incumbent = dropping.incumbent
    named = {
        i
        for i in ms
        if incumbent is not None
        and (plans[i].name == incumbent or plans[i].name.startswith(f"{incumbent}="))
    }
    if incumbent is not None and not named:
        return set(ms)
    keeps = named | {i for i in ms if plans[i].baseline}
    heuristic = [i for i in ms if plans[i].heuristic]
    if heuristic:
        keeps.add(min(heuristic, key=lambda i: float(np.median(ms[i]))))
    copies = {
        i: replace(
            plans[i],
            rounds_ms=list(v),
            earlier_ms=[r[i] for r in dropping.earlier if i in r],
            measured_ms=None,
        )
        for i, v in ms.items()
    }
    index = {id(p): i for i, p in copies.items()}
    quiet = rank_measured(list(copies.values()), incumbent)[0]
    noisy = Noise(math.inf, None, len(next(iter(ms.values()))), spread_limit=0.0)
    busy = keep(list(copies.values()), incumbent, [noisy])[0][0]
    return keeps | {index[id(quiet)], index[id(busy)]}
