"""How the observer samples: how far apart (what a sample may cost), and keeping the
profiler's own prints off the job's stderr."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator


def sampling_interval(extra_ms: float, step_ms: float, every: int, max_overhead: float) -> int:
    """Steps between samples: ``every`` at least, and enough that a sample costing
    ``extra_ms`` beyond a plain step of ``step_ms`` stays within ``max_overhead``."""
    if step_ms <= 0 or extra_ms <= 0:
        return every
    return max(every, math.ceil(extra_ms / (max_overhead * step_ms)))


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """File descriptor 2 on /dev/null for the block (C++ prints that Python cannot
    silence); restored after."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
