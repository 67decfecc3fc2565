"""What a plan spent its time on: the ledger of measured blocks and the planner's report.

The ledger reads a clock the test moves (``clock``, :class:`conftest.FakeClock`): every
figure is exact, on an idle machine or a loaded one."""

from __future__ import annotations

import pytest

from torchrec_dreamshard.measure.spent import PLANNING, spending, spent_lines, spent_on


def collectives(clock, seconds: float) -> None:
    """A measuring function, counted as the collectives' wherever it runs."""
    with spent_on("collectives"):
        clock.advance(seconds)


@spent_on("dense_kernel")
def dense_kernel(clock, seconds: float) -> None:
    clock.advance(seconds)


def test_nested_blocks_are_counted_once_and_everything_adds_up_to_the_wall_time(clock):
    start = clock()
    with spending(clock) as ledger:
        with spent_on("calibration"):
            clock.advance(0.25)
            collectives(clock, 0.1)  # inside the calibration: the collectives', not its
        collectives(clock, 0.02)
        dense_kernel(clock, 0.5)  # the decorator's form
        clock.advance(0.03)  # claimed by nothing: planning
        assert ledger.seconds()[PLANNING] == pytest.approx(0.03)  # so far, while open
    wall = clock() - start
    spent = ledger.seconds()
    assert spent == pytest.approx(
        {"calibration": 0.25, "collectives": 0.12, "dense_kernel": 0.5, PLANNING: 0.03}
    )
    assert sum(spent.values()) == pytest.approx(wall)
    clock.advance(7.0)
    assert ledger.seconds() == spent  # closed: it no longer runs on
    assert spent_lines(spent) == [
        "spent 0.9 s: dense kernel 0.5 s, calibration 0.2 s, collectives 0.1 s, planning 0.0 s"
    ]


def test_blocks_outside_a_ledger_count_nowhere_and_an_inner_ledger_is_its_own(clock):
    collectives(clock, 1.0)  # no ledger: nothing to count in, nothing raised
    with spending(clock) as outer:
        with spending(clock) as inner:
            collectives(clock, 0.01)
        with spent_on("verification"):
            clock.advance(0.2)
    assert inner.seconds() == pytest.approx({"collectives": 0.01, PLANNING: 0.0})
    # the inner ledger's seconds are the outer's planning: no block of the outer ran then
    assert outer.seconds() == pytest.approx({"verification": 0.2, PLANNING: 0.01})
    assert spent_lines({}) == []


def test_a_failing_block_still_counts_and_the_error_passes_through(clock):
    with spending(clock) as ledger:
        with pytest.raises(RuntimeError, match="boom"), spent_on("dense_kernel"):
            clock.advance(0.01)
            raise RuntimeError("boom")
    assert ledger.seconds() == pytest.approx({"dense_kernel": 0.01, PLANNING: 0.0})


def test_a_ledger_reads_the_process_clock_by_default():
    """Without a clock, the ledger runs on ``time.perf_counter`` (no figure asserted: how
    long a block takes is the benchmarks' to say)."""
    with spending() as ledger, spent_on("reference_kernel"):
        pass
    spent = ledger.seconds()
    assert set(spent) == {"reference_kernel", PLANNING}
    assert all(s >= 0.0 for s in spent.values())
