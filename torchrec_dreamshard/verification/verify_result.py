"""What a verification measured (:class:`VerifiedPlan`, :class:`VerifyResult`), and its
words: margins (:func:`percent`) and plan names (:func:`plan_words`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchrec_dreamshard.measure.guard import MeasureFailure
from torchrec_dreamshard.verification.noise import Noise


@dataclass(frozen=True)
class Dropped:
    """A plan clearly behind after a round, measured no more (:mod:`.dropping`).

    Attributes:
        after_round: rounds of its pass it was measured in.
        pass_index: the pass it dropped out of (0: the first).
        behind: its median over the fastest plan's, less 1.
        limit: how far behind a plan had to be to drop out then.
    """

    after_round: int
    pass_index: int
    behind: float
    limit: float
    fastest: str

    def describe(self) -> str:
        """E.g. ``"dropped after round 2: 34% behind ... (limit 10%)"``."""
        again = " of the second pass" if self.pass_index else ""
        return (
            f"dropped after round {self.after_round}{again}: {self.behind:.0%} behind "
            f"{plan_words(self.fastest)} (limit {self.limit:.0%})"
        )

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Dropped:
        return cls(
            int(data["after_round"]),
            int(data["pass_index"]),
            float(data["behind"]),
            float(data["limit"]),
            str(data["fastest"]),
        )


@dataclass
class VerifiedPlan:
    """One plan measured by :func:`~.verification.verify`."""

    name: str
    placement: list[int]
    predicted_ms: float
    log_std: float
    measured_ms: float | None = None  # median measured step over the deciding rounds
    rounds_ms: list[float] = field(default_factory=list)
    earlier_ms: list[float] = field(default_factory=list)  # a noisy first pass's rounds
    heuristic: bool = False  # a classic heuristic's plan (the reference)
    baseline: bool = False  # TorchRec's plan: the kept plan must not measure slower
    dropped: Dropped | None = None  # clearly behind after a round: measured no more

    @property
    def measured(self) -> bool:
        """Whether the plan was measured in any round (``measured_ms`` is not ``None``)."""
        return bool(self.rounds_ms or self.earlier_ms) and self.measured_ms is not None


@dataclass
class VerifyResult:
    """The plans :func:`~.verification.verify` measured, the kept first.

    Attributes:
        plans: the plans; ``rounds_ms`` the last pass's, ``measured_ms`` the median over
            the deciding rounds.
        seconds: wall time.
        cached: the rounds were read from this machine's cache.
        passes: each pass's noise.
        fallback: why the safer plan was kept (``None``: the ranking stands).
        left_out: plans a slow task did not measure (the last of ``plans``).
        failure: the measurement that failed and ended the verification (``None``: none).
        devices_timed: device table-sets timed.
        candidate_devices: timings measuring each plan on its own would have taken (0: not
            counted).
    """

    plans: list[VerifiedPlan]
    seconds: float
    cached: bool = False
    passes: list[Noise] = field(default_factory=list)
    fallback: str | None = None
    left_out: int = 0
    failure: MeasureFailure | None = None
    devices_timed: int = 0
    candidate_devices: int = 0

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
        heur = [p for p in self.plans if p.heuristic and p.measured and not p.dropped]
        return min(heur, key=lambda p: p.measured_ms or 0.0) if heur else None

    @property
    def not_measured(self) -> list[str]:
        """The names of the plans not measured."""
        return [p.name for p in self.plans if not p.measured]

    @property
    def dropped(self) -> list[VerifiedPlan]:
        """The plans that dropped out clearly behind after a round."""
        return [p for p in self.plans if p.dropped is not None]

    def sharing(self) -> str | None:
        """``"timed 23 device sets for 42 candidate devices"`` (``None``: not counted)."""
        if not self.candidate_devices:
            return None
        return (
            f"timed {self.devices_timed} device sets for {self.candidate_devices} candidate devices"
        )

    def margins(self) -> dict[str, Any]:
        """The kept plan's measured step over TorchRec's and the best heuristic's."""

        def ratio(other: VerifiedPlan | None) -> float | None:
            kept, against = self.winner.measured_ms, other.measured_ms if other else None
            if kept is None or against is None or not (other and other.measured):
                return None
            return kept / against

        return {
            "kept": self.winner.name,
            "vs_torchrec": ratio(self.baseline),
            "vs_best_heuristic": ratio(self.best_heuristic),
            "measured": self.winner.measured,
        }

    def summary(self, describe: Callable[[str], str] | None = None) -> str:
        """One line: what was measured, in how long, what was kept and by how much."""
        describe = describe or plan_words
        if self.failure is not None:
            return (
                f"verification failed ({self.failure.describe()}): kept "
                f"{describe(self.winner.name)}, not measured"
            )
        how = "read from this machine's cache" if self.cached else f"in {self.seconds:.1f} s"
        rounds = len(self.winner.rounds_ms)
        count = (
            f"{len(self.plans) - self.left_out} of {len(self.plans)}"
            if self.left_out
            else len(self.plans)
        )
        head = f"verified {count} plans {how} ({rounds} rounds): kept "
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
        if self.left_out:
            line += f"; a slow task: {self.left_out} plans predicted slower were not measured"
        if self.dropped:
            n = len(self.dropped)
            line += f"; {n} plan{'s' if n > 1 else ''} clearly behind dropped out"
        if self.sharing():
            line += f"; {self.sharing()}"
        if len(self.passes) > 1:
            line += f"; the first rounds were noisy ({self.passes[0].describe()}): measured again"
        if self.fallback:
            line += f"; {self.fallback}"
        return line

    def to_dict(self) -> dict[str, Any]:
        """JSON-able; a plan not measured has ``"measured": false`` and ``"measured_ms": null``."""
        return {
            "winner": self.winner.name,
            "seconds": self.seconds,
            "cached": self.cached,
            "passes": [n.to_dict() for n in self.passes],
            "fallback": self.fallback,
            "left_out": self.left_out,
            "failure": None if self.failure is None else self.failure.to_dict(),
            "not_measured": self.not_measured,
            "margins": self.margins(),
            "devices_timed": self.devices_timed,
            "candidate_devices": self.candidate_devices,
            "plans": [
                {
                    "name": p.name,
                    "predicted_ms": p.predicted_ms,
                    "measured": p.measured,
                    "measured_ms": p.measured_ms if p.measured else None,
                    "rounds_ms": p.rounds_ms,
                    "earlier_ms": p.earlier_ms,
                    "heuristic": p.heuristic,
                    "torchrec": p.baseline,
                    "dropped": None if p.dropped is None else p.dropped.to_dict(),
                }
                for p in self.plans
            ],
        }

    def lines(self) -> list[str]:
        """A table of the plans, predicted against measured ms."""
        if self.failure is not None:
            return [f"verification: {self.summary()}"]
        rounds = len(self.winner.rounds_ms)
        how = "read from this machine's cache" if self.cached else f"({self.seconds:.1f}s)"
        measured = len(self.plans) - len(self.not_measured)
        count = f"{measured} of {len(self.plans)}" if measured < len(self.plans) else measured
        out = [
            f"verification: {count} plans measured in {rounds} interleaved rounds "
            f"{how}; chosen: {self.winner.name}",
            *([f"  {self.sharing()}"] if self.sharing() else []),
            f"  {'plan':30s} {'predicted ms':>12s} {'measured ms':>12s} {'error':>7s}",
        ]
        for p in self.plans:
            if p.measured_ms is None or not p.measured:
                out.append(f"  {p.name:30s} {p.predicted_ms:12.3f} {'not measured':>12s}")
                continue
            err = (p.predicted_ms / p.measured_ms - 1.0) * 100.0
            row = f"  {p.name:30s} {p.predicted_ms:12.3f} {p.measured_ms:12.3f} {err:+6.1f}%"
            out.append(row + (f"  {p.dropped.describe()}" if p.dropped else ""))
        return out


def percent(ratio: float) -> str:
    """``"4.1% faster than"`` for a ratio of 0.959, ``"2.0% slower than"`` for 1.02."""
    if ratio <= 1.0:
        return f"{(1.0 - ratio) * 100:.1f}% faster than"
    return f"{(ratio - 1.0) * 100:.1f}% slower than"


TORCHREC_WORDS = "TorchRec's plan"


def plan_words(name: str, chosen: str | None = None) -> str:
    """A measured plan's name for people, e.g. ``"TorchRec's plan"``; a name that joins
    several (``chosen=torchrec_ours``) by its first."""
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
