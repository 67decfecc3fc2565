"""Candidates clearly behind after a round drop out (:class:`Dropping`).

The rule, after every round of a pass from the :data:`DROP_FROM_ROUND`-th on but its last
(after the first pass's last round only where a second pass follows): a plan whose
median over the pass's rounds so far is behind the fastest plan's median by more than
``max(DROP_SPREADS x spread, DROP_FLOOR)`` (``spread``: the rounds' spread as
:class:`~.noise.Noise` measures it, the median over plans of ``(max - min) / median``),
and that was slower than the fastest plan in every one of those rounds, is not measured
in later rounds, of this pass nor of a second. Its rounds so far are kept and shown, and
it is not ranked: a plan that dropped out cannot be kept.

Never dropped, so that dropping cannot change what :func:`~.plan_ranking.keep` is able to
decide: TorchRec's plan (the kept plan must beat it), the incumbent named (the plan that
stands unless beaten every round), the fastest heuristic plan by median (the incumbent
where none is named, and the safer plan of a noisy pass where TorchRec's was not
measured), and the plan :func:`~.plan_ranking.keep` would keep over the rounds so far,
quiet or noisy.
"""

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
        incumbent: the incumbent's name (:class:`~.verification.VerifyOptions`).
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
        """Drop the plans clearly behind after the pass's ``rounds`` so far (see the
        module docstring)."""
        if not self.enabled or len(rounds) < DROP_FROM_ROUND:
            return
        self.dropped.update(clearly_behind(self.plans, rounds, self, pass_index))


def clearly_behind(
    plans: Sequence[VerifiedPlan],
    rounds: Sequence[Mapping[int, float]],
    dropping: Dropping,
    pass_index: int,
) -> dict[int, Dropped]:
    """The plans of the last round of ``rounds`` that drop out now, by index (see the
    module docstring)."""
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
    """The indices among ``ms`` (a plan's rounds so far, by index) that never drop out:
    TorchRec's plan, the named incumbent, the fastest heuristic plan, and the plan the
    ranking would keep now, quiet or noisy. Every index where the incumbent is named but
    not among them (the ranking then refuses the verification, as before)."""
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
