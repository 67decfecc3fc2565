"""Which measured plan a verification keeps (:func:`keep`).

1. The incumbent (the planner's choice, else the fastest heuristic's) stands unless other
   plans beat it in every round and by :data:`REPLACE_MARGIN` at the median.
2. The kept plan must beat TorchRec's plan beyond the noise (:func:`beats_beyond_noise`),
   else the fastest plan that does, else TorchRec's own.
3. Where the deciding rounds were noisy, every pass's rounds decide together, and the safer
   plan (:func:`safer_plan`) stands unless a plan beat it beyond the noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from torchrec_dreamshard.verification.noise import Noise, sign_test_wins
from torchrec_dreamshard.verification.verify_result import VerifiedPlan, plan_words

MIN_ROUNDS_TO_REPLACE = 2  # rounds a plan must win before it replaces a named incumbent
REPLACE_MARGIN = 0.03  # ... and by this much at the median: identical plans move 3% here
FEW_ROUNDS_MARGIN = 0.05  # under 3 rounds, a plan beats TorchRec's by this much every round
VERDICT_ERROR = 0.01  # a plan replaces TorchRec's only with a median this much lower


def beats_beyond_noise(p: VerifiedPlan, ref: VerifiedPlan) -> bool:
    """Whether ``p`` beat ``ref``: a lower median and a sign test's wins; under 3 rounds,
    faster in every round by :data:`FEW_ROUNDS_MARGIN`."""
    n = min(len(p.rounds_ms), len(ref.rounds_ms))
    margin = VERDICT_ERROR if ref.baseline else 0.0
    if not n or not np.median(p.rounds_ms) < (1.0 - margin) * np.median(ref.rounds_ms):
        return False
    pairs = list(zip(p.rounds_ms, ref.rounds_ms, strict=False))
    need = sign_test_wins(n)
    if need is None:
        return all(a < (1.0 - FEW_ROUNDS_MARGIN) * b for a, b in pairs)
    return sum(a < b for a, b in pairs) >= need


def rank_measured(
    plans: Sequence[VerifiedPlan], incumbent: str | None = None
) -> list[VerifiedPlan]:
    """``plans`` (measured in the same rounds), the kept plan first, then by median.

    Rules 1 and 2 of the module docstring; the named ``incumbent`` is replaced only after
    :data:`MIN_ROUNDS_TO_REPLACE` rounds.
    """
    ranked = _rank_incumbent(plans, incumbent)
    base = next((p for p in ranked if p.baseline), None)
    if not min((len(p.rounds_ms) for p in plans), default=0):
        return ranked  # nothing measured: TorchRec's plan has not shown itself faster either
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
        p.measured_ms = float(np.median(p.rounds_ms)) if p.rounds_ms else None
    ordered = sorted(plans, key=lambda p: p.measured_ms or 0.0) if rounds else list(plans)
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
        every = all(a < b for a, b in zip(p.rounds_ms, ref.rounds_ms, strict=True))
        return every and p.measured_ms < (1.0 - REPLACE_MARGIN) * ref.measured_ms

    winner = next((p for p in ordered if p is ref or beats(p)), ref)
    return [winner, *(p for p in ordered if p is not winner)]


def measuring_priority(plans: Sequence[VerifiedPlan], incumbent: str | None) -> list[int]:
    """Indices of ``plans`` in the order a slow task measures them: the incumbent,
    TorchRec's plan, the fastest predicted heuristic, then by predicted step."""
    heur = [i for i, p in enumerate(plans) if p.heuristic]
    best_heuristic = min(heur, key=lambda i: plans[i].predicted_ms, default=None)

    def rank(i: int) -> tuple[int, float]:
        p = plans[i]
        named = incumbent is not None and p.name.split("=")[0] == incumbent
        first = 0 if named else 1 if p.baseline else 2 if i == best_heuristic else 3
        return first, p.predicted_ms

    return sorted(range(len(plans)), key=rank)


def safer_plan(plans: Sequence[VerifiedPlan]) -> VerifiedPlan | None:
    """TorchRec's plan where measured, else the fastest heuristic's (``None``: neither)."""
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
    """:func:`rank_measured`, then rule 3 over at least 3 pooled rounds; and why the safer plan
    was kept (``None``: the ranking stands)."""
    ranked = rank_measured(plans, incumbent)
    if not passes or not passes[-1].noisy:
        return ranked, None
    every = {p.name: pooled(p) for p in ranked}  # names are distinct (verify_candidates)
    safer = safer_plan(list(every.values()))
    if safer is None:
        return ranked, None
    enough = len(safer.rounds_ms) >= 3
    winners = [
        every[p.name]
        for p in ranked
        if p.name != safer.name and enough and beats_beyond_noise(every[p.name], safer)
    ]
    best = min(winners, key=lambda p: p.measured_ms) if winners else safer
    kept = next(p for p in ranked if p.name == best.name)
    for p in ranked:  # the margins are then over every round that decided
        p.measured_ms = every[p.name].measured_ms
    again = " again" if len(passes) > 1 else ""
    why = f"the measurements were noisy{again} ({passes[-1].describe()}): kept "
    if best is safer:
        why += f"{plan_words(safer.name)}, the safer plan"
    else:
        wins = sum(a < b for a, b in zip(best.rounds_ms, safer.rounds_ms, strict=True))
        why += (
            f"a plan faster than {plan_words(safer.name)} beyond the noise over every pass "
            f"(in {wins} of {len(safer.rounds_ms)} rounds; median {best.measured_ms:.2f} ms "
            f"against {safer.measured_ms:.2f} ms)"
        )
    return [kept, *(p for p in ranked if p is not kept)], why


def pooled(p: VerifiedPlan) -> VerifiedPlan:
    """A copy of ``p`` measured over every pass's rounds."""
    rounds = [*p.earlier_ms, *p.rounds_ms]
    median = float(np.median(rounds)) if rounds else None
    return replace(p, rounds_ms=rounds, earlier_ms=[], measured_ms=median)
