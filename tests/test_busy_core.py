"""The benchmarks' busy core: a real spinning process, pinned, and gone afterwards."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from harness.busy_core import keep_core_busy


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spins(pid: int, cpu_s: float = 0.5, within_s: float = 120.0) -> bool:
    """Whether ``pid`` runs ``cpu_s`` seconds on a CPU before ``within_s`` seconds pass: a
    spinning process does however loaded the core (it gets a share), a sleeping one never
    does. (How much of a core it takes is not asserted: a CI core is shared.)"""
    before = cpu_seconds(pid)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if cpu_seconds(pid) - before >= cpu_s:
            return True
        time.sleep(0.05)
    return False


def test_a_process_spins_on_the_last_core_while_the_block_runs_and_is_gone_after():
    with keep_core_busy() as spinner:
        assert os.sched_getaffinity(spinner.pid) == {max(os.sched_getaffinity(0))}
        assert spins(spinner.pid)  # it spins, not sleeps
    assert spinner.returncode is not None  # killed and reaped


def test_it_stops_when_the_block_raises():
    with pytest.raises(KeyboardInterrupt):
        with keep_core_busy() as spinner:
            raise KeyboardInterrupt
    assert spinner.returncode is not None


def test_a_core_this_process_may_not_use_is_refused():
    with pytest.raises(ValueError, match="core 4096 is not one of"):
        with keep_core_busy(4096):
            pass
