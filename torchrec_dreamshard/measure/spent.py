"""What a plan spent its time on: :func:`spending` opens a ledger and every :func:`spent_on`
block inside it adds its seconds, less those of the blocks nested in it, so the figures add
up to the plan's wall time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar

PLANNING = "planning"  # what no measurement claimed: search, pricing, TorchRec's planner

# the ledger of the innermost open spending(), or None
_LEDGER: ContextVar[Spending | None] = ContextVar("dreamshard_spending", default=None)


Clock = Callable[[], float]
"""A clock: seconds, from any origin, never going back (``time.perf_counter``)."""


class Spending:
    """Seconds per activity (:data:`PLANNING` for the rest) since the ledger was opened."""

    def __init__(self, clock: Clock = time.perf_counter) -> None:
        self._clock = clock
        self._start = clock()
        self._spent: dict[str, float] = {}
        self._end: float | None = None  # set when the ledger's block ends
        self._nested = [0.0]  # per open block (the ledger itself first): its blocks' seconds

    def seconds(self) -> dict[str, float]:
        """Seconds per activity so far (in all once the ledger closed), :data:`PLANNING` last."""
        total = (self._clock() if self._end is None else self._end) - self._start
        return {**self._spent, PLANNING: max(0.0, total - sum(self._spent.values()))}

    @contextlib.contextmanager
    def _block(self, what: str) -> Iterator[None]:
        start = self._clock()
        self._nested.append(0.0)
        try:
            yield
        finally:
            elapsed = self._clock() - start
            inner = self._nested.pop()
            self._nested[-1] += elapsed
            self._spent[what] = self._spent.get(what, 0.0) + max(0.0, elapsed - inner)


@contextlib.contextmanager
def spending(clock: Clock = time.perf_counter) -> Iterator[Spending]:
    """A new ledger for the block, reading ``clock`` (an enclosing one is restored after)."""
    ledger = Spending(clock)
    token = _LEDGER.set(ledger)
    try:
        yield ledger
    finally:
        ledger._end = ledger._clock()
        _LEDGER.reset(token)


@contextlib.contextmanager
def spent_on(what: str) -> Iterator[None]:
    """Count the block's own seconds under ``what`` in the open ledger, if any."""
    ledger = _LEDGER.get()
    if ledger is None:
        yield
        return
    with ledger._block(what):
        yield


def spent_lines(seconds: dict[str, float]) -> list[str]:
    """``seconds`` (:meth:`Spending.seconds`) as one line, largest first."""
    if not seconds:
        return []
    total = sum(seconds.values())
    parts = [
        f"{what.replace('_', ' ')} {s:.1f} s"
        for what, s in sorted(seconds.items(), key=lambda item: -item[1])
    ]
    return [f"spent {total:.1f} s: " + ", ".join(parts)]
