"""Whether measurements taken on a busy machine can be trusted: the spread between rounds
and the reference kernel's drift (:class:`Noise`), and the sign test's wins
(:func:`sign_test_wins`). Calibration's drift check uses :func:`reference_drift`."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchrec_dreamshard.measure import reference_speed
from torchrec_dreamshard.measure.config import MeasureConfig

SPREAD_LIMIT = 0.20  # a plan's rounds (max - min) / median beyond this (median over plans)
DRIFT_LIMIT = 0.20  # the reference kernel after / before - 1 beyond this, either way
SIGN_ALPHA = 0.125  # one-sided sign test: 3 of 3 rounds, 4 of 4, 5 of 5 or 6, 6 of 7 ...


def reference_drift(before: float | None, after: float | None) -> float | None:
    """``after / before - 1`` of two reference timings (``None``: either missing or <= 0)."""
    if before is None or after is None or not (before > 0 and after > 0):
        return None
    return after / before - 1.0


@dataclass(frozen=True)
class NoiseLimits:
    """When :func:`verify`'s measurements count as noisy, and what it does then.

    Args:
        spread: the median over plans of ``(max - min) / median`` of their rounds above
            which the rounds disagree.
        drift: ``|after / before - 1|`` of the reference kernel above which the machine
            changed speed (``inf``: the reference is not timed).
        extra_rounds: rounds of the second pass (``None``: as many as the first; 0: keep
            the safer plan at once).
        extra_budget: the second pass's budget, as a fraction of ``budget_s``.
    """

    spread: float = SPREAD_LIMIT
    drift: float = DRIFT_LIMIT
    extra_rounds: int | None = None
    extra_budget: float = 1.0

    @classmethod
    def off(cls) -> NoiseLimits:
        """Never noisy: no reference timed, no second pass, no fallback."""
        return cls(spread=math.inf, drift=math.inf, extra_rounds=0)


@dataclass
class Noise:
    """How noisy one pass of measurements was.

    Attributes:
        spread: median over plans of ``(max - min) / median`` (``nan``: under two rounds).
        drift: the reference kernel's ``after / before - 1`` (``None``: not timed).
        rounds: whole rounds in the pass.
        spread_limit, drift_limit: the limits it was judged by.
    """

    spread: float
    drift: float | None
    rounds: int
    spread_limit: float = SPREAD_LIMIT
    drift_limit: float = DRIFT_LIMIT

    @classmethod
    def of(
        cls,
        rounds: Sequence[Mapping[int, float]],
        reference: tuple[float | None, float | None],
        limits: NoiseLimits,
    ) -> Noise:
        """The noise of ``rounds`` (``{plan index: ms}`` each) and the reference ``(before,
        after)``."""
        spreads = []
        for i in rounds[0] if rounds else ():
            ms = np.array([r[i] for r in rounds if i in r], dtype=np.float64)
            if len(ms) >= 2 and np.median(ms) > 0:
                spreads.append(float((ms.max() - ms.min()) / np.median(ms)))
        spread = float(np.median(spreads)) if spreads else float("nan")
        drift = reference_drift(*reference)
        return cls(spread, drift, len(rounds), limits.spread, limits.drift)

    @property
    def noisy(self) -> bool:
        spread = self.spread > self.spread_limit  # False for nan
        return spread or (self.drift is not None and abs(self.drift) > self.drift_limit)

    def describe(self) -> str:
        """``"rounds spread 31% (limit 20%), reference kernel drifted +25% (limit 20%)"``."""
        if math.isnan(self.spread):
            out = ["no whole round measured"]
        else:
            out = [f"rounds spread {self.spread:.0%} (limit {self.spread_limit:.0%})"]
        if self.drift is not None:
            out.append(f"reference kernel drifted {self.drift:+.0%} (limit {self.drift_limit:.0%})")
        return ", ".join(out)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (a ``nan`` spread and infinite limits as ``None``)."""
        out: dict[str, Any] = {
            k: v if v is None or math.isfinite(v) else None for k, v in self.__dict__.items()
        }
        return {**out, "noisy": self.noisy}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Noise:
        """The inverse of :meth:`to_dict`."""

        def number(key: str, missing: float) -> float:
            return missing if data[key] is None else float(data[key])

        return cls(
            number("spread", math.nan),
            None if data["drift"] is None else float(data["drift"]),
            int(data["rounds"]),
            number("spread_limit", math.inf),
            number("drift_limit", math.inf),
        )


def sign_test_wins(rounds: int, alpha: float = SIGN_ALPHA) -> int | None:
    """The fewest wins out of ``rounds`` for a one-sided sign test at ``alpha`` (``None``:
    none is enough)."""
    for wins in range(rounds + 1):
        tail = sum(math.comb(rounds, j) for j in range(wins, rounds + 1)) / 2**rounds
        if tail <= alpha:
            return wins
    return None


def lasting_drift(before: float | None, config: MeasureConfig, limit: float) -> float | None:
    """How far the reference kernel moved since ``before``; beyond ``limit``, the median of
    three timings, so that a blip does not count."""
    after = [reference_ms(config)]
    drift = reference_drift(before, after[0])
    if drift is not None and abs(drift) > limit:
        after += [reference_ms(config), reference_ms(config)]
        drift = reference_drift(before, statistics.median(after))
    return drift


def reference_ms(config: MeasureConfig) -> float:
    """The reference kernel's fwd + bwd now (a fraction of a second)."""
    return float(sum(reference_speed.measure_reference_ms(config.device)))
