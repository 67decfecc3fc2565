"""Tests of torchrec_dreamshard.measure.rounds: plans measured in interleaved rounds."""

from __future__ import annotations

import itertools

import pytest

from torchrec_dreamshard.data.sampler import make_task
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.measure import (
    balanced_order,
    measure_in_rounds,
    measure_plans,
    placement_timing,
    round_order,
)
from torchrec_dreamshard.measure.measurements import PlacementMeasurement


def recorder():
    """A ``measure`` that returns ``(group, key, n)`` for the n-th call, and the calls."""
    calls: list[tuple[int, str]] = []

    def measure(g: int, key: str):
        calls.append((g, key))
        return (g, key, len(calls))

    return measure, calls


def test_round_order_rotates_so_every_item_takes_every_position():
    assert round_order(0, 3) == []
    assert [round_order(2, r) for r in range(3)] == [[0, 1], [1, 0], [0, 1]]
    orders = [round_order(4, r) for r in range(4)]
    for pos in range(4):
        assert sorted(o[pos] for o in orders) == [0, 1, 2, 3]
    assert all(sorted(o) == [0, 1, 2, 3] for o in orders)


def test_balanced_order_alternates_and_visits_every_order():
    names = "AB"
    assert ["".join(names[i] for i in balanced_order(2, r)) for r in range(4)] == [
        "AB", "BA", "BA", "AB",
    ]  # fmt: skip
    three = {tuple(balanced_order(3, r)) for r in range(6)}
    assert three == set(itertools.permutations(range(3)))


def test_an_order_shifted_by_the_rounds_already_run_continues_where_a_run_stopped():
    """The step timer resumes a run in another process: rounds 2 and 3 of a run started
    at round 2 take the orders rounds 2 and 3 of one long run take."""
    measure, calls = recorder()
    measure_in_rounds([["a", "b"]], measure, 4, order=balanced_order)
    whole = [k for _, k in calls]
    measure, calls = recorder()
    measure_in_rounds([["a", "b"]], measure, 2, order=lambda n, r: balanced_order(n, 2 + r))
    assert [k for _, k in calls] == whole[4:] == ["b", "a", "a", "b"]


def test_two_plans_alternate_and_every_plan_is_measured_every_round():
    measure, calls = recorder()
    out = measure_in_rounds([["a", "b"]], measure, 4)
    assert [k for _, k in calls] == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert len(out) == 1 and len(out[0]) == 4
    assert all(set(r) == {"a", "b"} for r in out[0])
    # each round's result is the measurement taken in that round
    assert [out[0][r]["a"][2] for r in range(4)] == [1, 4, 5, 8]


def test_a_round_visits_every_task_before_the_next_round():
    measure, calls = recorder()
    groups = [["a", "b", "c"], ["x"], []]
    out = measure_in_rounds(groups, measure, 3)
    per_round = [calls[k * 4 : (k + 1) * 4] for k in range(3)]
    for r, chunk in enumerate(per_round):
        assert sorted(chunk) == [(0, "a"), (0, "b"), (0, "c"), (1, "x")], r
    assert [g for g, _ in per_round[1]][0] == 1  # the task order rotates too
    assert [len(rs) for rs in out] == [3, 3, 3] and out[2] == [{}, {}, {}]
    assert len(calls) == 12


def test_resumes_from_stored_rounds_without_measuring_them_again():
    measure, calls = recorder()
    saved: list[list[dict]] = [[], []]
    ended: list[int] = []

    def crash_on_the_eighth(g, key):
        if len(calls) == 7:
            raise KeyboardInterrupt
        return measure(g, key)

    def keep(g, r, results):
        assert len(saved[g]) == r
        saved[g].append(results)

    groups = [["a", "b"], ["x", "y"]]
    with pytest.raises(KeyboardInterrupt):
        measure_in_rounds(groups, crash_on_the_eighth, 3, on_group=keep, on_round=ended.append)
    # round 1 visits group 1 first: it finished, group 0 was cut short
    assert [len(s) for s in saved] == [1, 2] and ended == [0]
    before = [list(s) for s in saved]
    out = measure_in_rounds(groups, measure, 3, done=saved, on_group=keep, on_round=ended.append)
    # group 0's round 1 and both groups' round 2: 3 group-rounds of 2 plans, nothing twice
    assert len(calls) == 7 + 6 and ended == [0, 1, 2]
    assert out == saved and [len(rs) for rs in out] == [3, 3]
    assert out[0][:1] == before[0] and out[1][:2] == before[1]
    assert all(set(r) == set(keys) for keys, rs in zip(groups, out, strict=True) for r in rs)
    calls.clear()
    measure_in_rounds(groups, measure, 3, done=out, on_round=ended.append)
    assert calls == [] and ended == [0, 1, 2]  # all measured: no round is reported


def test_rejects_repeated_keys_and_mismatched_stored_rounds():
    measure, _ = recorder()
    with pytest.raises(ValueError, match="repeats a plan key"):
        measure_in_rounds([["a", "a"]], measure, 1)
    with pytest.raises(ValueError, match="1 groups' rounds for 2 groups"):
        measure_in_rounds([["a"], ["b"]], measure, 1, done=[[]])


def test_measure_plans_measures_each_named_placement_and_names_a_failure(monkeypatch):
    tables = [TableSpec(name=f"t{i}", rows=1000, dim=8, pooling_factor=2.0) for i in range(3)]
    task = make_task(tables, 2, 256, 2.0)
    seen = []

    def fake(task_, placement, config=None, backend="local", comm=None):
        seen.append((tuple(placement), backend))
        if placement == [1, 1, 1]:
            return PlacementMeasurement.failed("out of memory", backend)
        return PlacementMeasurement([], float(sum(placement)), 0.0, 1.0, backend=backend)

    monkeypatch.setattr(placement_timing, "measure_placement", fake)
    plans = {"left": [0, 0, 1], "right": [1, 0, 1]}
    out = measure_plans(task, plans, rounds=2, backend="distributed")
    assert [[(n, m.step_ms) for n, m in r.items()] for r in out] == [
        [("left", 1.0), ("right", 2.0)],
        [("right", 2.0), ("left", 1.0)],
    ]
    assert {b for _, b in seen} == {"distributed"}
    with pytest.raises(RuntimeError, match="'bad' failed: out of memory"):
        measure_plans(task, {"bad": [1, 1, 1]})
