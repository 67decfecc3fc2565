"""Another process that keeps one core busy while a benchmark runs (:func:`keep_core_busy`):
a user's machine is rarely idle while they plan (data loading, another job, a notebook),
and a benchmark run this way shows what the planner does then."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

SPIN = "while True:\n    pass\n"


@contextmanager
def keep_core_busy(core: int | None = None) -> Iterator[subprocess.Popen]:
    """Run a process that spins on ``core`` (default: the last core) until the block
    ends, however it ends; yields that process.

    Raises:
        ValueError: ``core`` is not one this process may run on.
    """
    allowed = sorted(os.sched_getaffinity(0))
    core = allowed[-1] if core is None else core
    if core not in allowed:
        raise ValueError(f"core {core} is not one of this process's cores {allowed}")
    spinner = subprocess.Popen(
        [sys.executable, "-c", SPIN],
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
        stdin=subprocess.DEVNULL,
    )
    try:
        yield spinner
    finally:
        spinner.kill()
        spinner.wait()
