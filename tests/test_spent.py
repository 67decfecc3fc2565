"""What a plan spent its time on: the ledger of measured blocks and the planner's report."""

from __future__ import annotations

import time

import pytest

from torchrec_dreamshard.measure.spent import PLANNING, spending, spent_lines, spent_on


@spent_on("collectives")
def _collectives(seconds: float) -> None:
    time.sleep(seconds)


def test_nested_blocks_are_counted_once_and_everything_adds_up_to_the_wall_time():
    start = time.perf_counter()
    with spending() as ledger:
        with spent_on("calibration"):
            time.sleep(0.05)
            _collectives(0.1)  # inside the calibration: the collectives', not its
        _collectives(0.02)
        time.sleep(0.03)  # claimed by nothing: planning
    wall = time.perf_counter() - start
    spent = ledger.seconds()
    assert set(spent) == {"calibration", "collectives", PLANNING}
    assert spent["collectives"] == pytest.approx(0.12, abs=0.04)
    assert 0.05 <= spent["calibration"] < 0.1  # without the 0.1 s of collectives in it
    assert spent[PLANNING] >= 0.03
    assert sum(spent.values()) == pytest.approx(wall, abs=0.01)
    time.sleep(0.02)
    assert ledger.seconds() == spent  # closed: it no longer runs on
    assert spent_lines(spent)[0].startswith(f"spent {sum(spent.values()):.1f} s: collectives")


def test_blocks_outside_a_ledger_count_nowhere_and_an_inner_ledger_is_its_own():
    _collectives(0.0)  # no ledger: nothing to count in, nothing raised
    with spending() as outer:
        with spending() as inner:
            _collectives(0.01)
        with spent_on("verification"):
            pass
    assert "collectives" in inner.seconds() and "collectives" not in outer.seconds()
    assert set(outer.seconds()) == {"verification", PLANNING}
    assert spent_lines({}) == []


def test_a_failing_block_still_counts_and_the_error_passes_through():
    with spending() as ledger:
        with pytest.raises(RuntimeError, match="boom"), spent_on("dense_kernel"):
            time.sleep(0.01)
            raise RuntimeError("boom")
    assert ledger.seconds()["dense_kernel"] >= 0.01
