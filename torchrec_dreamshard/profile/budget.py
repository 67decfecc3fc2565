"""The plan's time budget: TorchRec's ``timeout_seconds`` bounds the whole ``plan()``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

CLOCK: Callable[[], float] = time.monotonic  # what a budget counts on by default


@dataclass
class Budget:
    """Seconds a plan may spend, counted from the budget's creation.

    Args:
        seconds: the whole budget (``None``: unbounded).
        clock: the clock, in seconds (default :data:`CLOCK`, read when the budget is made).
    """

    seconds: float | None
    clock: Callable[[], float] | None = None
    start: float = field(init=False)

    def __post_init__(self) -> None:
        if self.clock is None:
            self.clock = CLOCK
        if self.seconds is not None and not (
            isinstance(self.seconds, int | float) and self.seconds > 0
        ):
            raise ValueError(f"a budget must be > 0 seconds or None, got {self.seconds!r}")
        self.start = self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def remaining(self) -> float:
        """Seconds left (``inf`` when unbounded, never below 0)."""
        if self.seconds is None:
            return math.inf
        return max(0.0, self.seconds - self.elapsed())

    def share(self, fraction: float, cap: float) -> float:
        """``fraction`` of what is left, at most ``cap`` seconds."""
        return min(cap, self.remaining() * fraction)

    def exhausted(self, need: float = 0.0) -> bool:
        """Whether fewer than ``need`` seconds are left (any at all for 0)."""
        left = self.remaining()
        return left <= 0.0 or left < need
