"""Column-wise splits: shard sizing, shard tasks, plan entries and the split search."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from torchrec_dreamshard.data.splits import (
    column_shards,
    plan_entries,
    plan_from_entries,
    shard_task,
    split_counts,
)
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task, device_bytes
from torchrec_dreamshard.policy import DreamShard
from torchrec_dreamshard.policy.protocol import PlaceSettings
from torchrec_dreamshard.policy.split_search import plan_with_splits


def _table(name: str, rows: int = 1000, dim: int = 64, pf: float = 3.0) -> TableSpec:
    return TableSpec(name=name, rows=rows, dim=dim, pooling_factor=pf)


def _task(tables, devices=4, factor=1.5, **kw) -> Task:
    total = sum(t.size_bytes for t in tables)
    mem = int(factor * total / devices)
    return Task(tables=tables, num_devices=devices, memory_bytes=mem, batch_size=512, **kw)


def test_split_counts_follow_torchrec_rule():
    spec = _table("t", dim=64)
    assert split_counts(spec, 16) == [2, 4, 8, 16]  # widths 32, 16, 8, 4
    assert split_counts(spec, 16, min_width=16) == [2, 4]
    assert split_counts(_table("odd", dim=12), 16) == [3]  # width 4
    assert split_counts(_table("narrow", dim=6), 16) == []


def test_column_shards_cover_the_columns_once():
    spec = dataclasses.replace(_table("t0", dim=128), reuse_hist=None)
    shards = column_shards(spec, 4)
    assert [s.name for s in shards] == ["t0@0:32", "t0@32:64", "t0@64:96", "t0@96:128"]
    assert all(s.rows == spec.rows and s.pooling_factor == spec.pooling_factor for s in shards)
    assert sum(s.dim for s in shards) == spec.dim
    assert sum(s.size_bytes for s in shards) == spec.size_bytes
    assert column_shards(spec, 1) == [spec]
    with pytest.raises(ValueError, match="allowed counts"):
        column_shards(spec, 3)


def test_oversized_tables_need_allow_oversized():
    tables = [_table("big", rows=100_000, dim=64), _table("s", rows=10)]
    with pytest.raises(ValueError, match="bigger than every device"):
        Task(tables=tables, num_devices=4, memory_bytes=10_000_000, batch_size=64)
    Task(tables=tables, num_devices=4, memory_bytes=10_000_000, batch_size=64, allow_oversized=True)


def test_plan_entries_round_trip():
    task = _task([_table("a", dim=64), _table("b", dim=32)], factor=3.0)
    sharded = shard_task(task, {"a": 2})
    assert sharded.shards.names == ["a@0:32", "a@32:64", "b"]
    whole, shards = plan_entries(sharded, [0, 3, 1])
    assert whole == {"b": 1}
    assert shards == {"a": [{"device": 0, "columns": [0, 32]}, {"device": 3, "columns": [32, 64]}]}
    again, placement = plan_from_entries(task, whole, shards)
    assert again.shards.names == sharded.shards.names and placement == [0, 3, 1]


@pytest.mark.parametrize(
    "shards, match",
    [
        ({"a": [{"device": 0, "columns": [0, 16]}]}, "end at 16"),
        ({"a": [{"device": 0, "columns": [0, 32]}, {"device": 1, "columns": [16, 64]}]}, "once"),
        ({"a": [{"device": 0, "cols": [0, 64]}]}, "each must be"),
    ],
)
def test_plan_from_entries_refuses_bad_shards(shards, match):
    task = _task([_table("a", dim=64), _table("b", dim=32)], factor=3.0)
    with pytest.raises(ValueError, match=match):
        plan_from_entries(task, {"b": 0}, shards)


def test_plan_from_entries_refuses_a_table_twice():
    task = _task([_table("a", dim=64), _table("b", dim=32)], factor=3.0)
    with pytest.raises(ValueError, match="both"):
        plan_from_entries(task, {"a": 0, "b": 0}, {"a": [{"device": 1, "columns": [0, 64]}]})


def _check_plan(task: Task, plan) -> None:
    """Shards cover each table's columns exactly once, on as many devices, and every
    device's memory holds."""
    whole, shards = plan_entries(plan.sharded, plan.placement)
    assert set(whole) | set(shards) == set(task.names)
    for name, entries in shards.items():
        dim = next(t.dim for t in task.tables if t.name == name)
        cols = [e["columns"] for e in entries]
        assert cols[0][0] == 0 and cols[-1][1] == dim
        assert all(a[1] == b[0] for a, b in zip(cols, cols[1:], strict=False))
        assert len({e["device"] for e in entries}) == len(entries)
    used = device_bytes(plan.sharded.shards, plan.placement)
    assert all(u <= m for u, m in zip(used, task.memory, strict=True))


def test_a_table_too_big_for_every_device_is_split():
    small = [_table(f"s{i}", rows=2000, dim=32) for i in range(12)]
    big = _table("big", rows=40_000, dim=128)
    task = _task([big, *small], devices=4, factor=1.2, allow_oversized=True)
    assert big.size_bytes > max(task.memory)
    plan = plan_with_splits(DreamShard.untrained(seed=0), task)
    assert plan.whole_ms is None
    assert plan.sharded.counts["big"] >= 2
    _check_plan(task, plan)


def test_unsplittable_oversized_table_is_named():
    big = _table("big", rows=40_000, dim=128)
    task = _task([big, _table("s", rows=10)], devices=4, factor=1.2, allow_oversized=True)
    with pytest.raises(ValueError, match="'big'.*may not be split"):
        plan_with_splits(DreamShard.untrained(seed=0), task, splittable={"s": 4})


def test_split_search_never_predicts_worse_than_whole_tables():
    """The cost network's prediction of the split plan, asked afresh, is no worse than its
    prediction of the whole-table plan the agent places by itself in the same mode, and
    the search reports both as the network predicts them."""
    tables = [_table(f"t{i}", rows=500 * (i + 1), dim=16 * (1 + i % 4)) for i in range(16)]
    task = _task(tables, devices=4, factor=1.3)
    agent = DreamShard.untrained(seed=1)
    plan = plan_with_splits(agent, task, PlaceSettings("search", 4))
    whole = agent.place(task, mode="search", num_samples=4, seed=0)
    whole_ms = agent.predict(task, whole).step_ms
    split_ms = agent.predict(plan.sharded.shards, plan.placement).step_ms
    assert plan.whole_ms == pytest.approx(whole_ms, rel=1e-6)
    assert plan.predicted_ms == pytest.approx(split_ms, rel=1e-6)
    assert split_ms <= whole_ms * (1 + 1e-6)
    _check_plan(task, plan)


def _additive_ms(task: Task, placement) -> float:
    """The slowest device's sum of ``dim x pooling`` (what :class:`_AdditiveAgent`
    predicts), computed here."""
    load = [0.0] * task.num_devices
    for spec, d in zip(task.tables, placement, strict=True):
        load[d] += spec.dim * spec.pooling_factor
    return max(load)


def _additive_optimum_two_devices(task: Task) -> float:
    """The lowest :func:`_additive_ms` over every plan of ``task`` on two devices: each
    table whole on either device, or halved column-wise (a half on each device), within
    memory. Exhaustive: ``3^T`` plans."""
    import itertools

    best = float("inf")
    for choice in itertools.product((0, 1, "half"), repeat=len(task.tables)):
        load, used = [0.0, 0.0], [0, 0]
        for spec, c in zip(task.tables, choice, strict=True):
            if c == "half" and spec.dim % 8:
                break  # halves must be multiples of 4 columns
            for d in (0, 1) if c == "half" else (c,):
                share = 2 if c == "half" else 1
                load[d] += spec.dim * spec.pooling_factor / share
                used[d] += spec.size_bytes // share
        else:
            if all(u <= m for u, m in zip(used, task.memory, strict=True)):
                best = min(best, max(load))
    return best


def _small_task(seed: int) -> Task:
    """Five random tables on two devices, with 1.5x to 3x the memory they need."""
    rng = np.random.default_rng(seed)
    tables = [
        _table(
            f"t{i}",
            rows=int(rng.integers(500, 4000)),
            dim=int(rng.choice([16, 32, 64, 128])),
            pf=float(rng.uniform(1, 40)),
        )
        for i in range(5)
    ]
    return _task(tables, devices=2, factor=1.5 + float(rng.uniform(0, 1.5)))


def test_split_plans_of_small_tasks_against_every_plan():
    """On five-table, two-device tasks under an additive cost model, every plan enumerated:
    the split plan is never slower than the agent's own whole-table plan, never faster
    than the best plan there is (so its cost is a real plan's), and splitting pays on at
    least one task."""
    gains = []
    for seed in range(8):
        task, agent = _small_task(seed), _AdditiveAgent()
        plan = plan_with_splits(agent, task)
        _check_plan(task, plan)
        got = _additive_ms(plan.sharded.shards, plan.placement)
        whole = _additive_ms(task, agent.place(task))
        assert plan.predicted_ms == pytest.approx(got)
        assert _additive_optimum_two_devices(task) - 1e-9 <= got <= whole + 1e-9
        gains.append(got / whole)
    assert min(gains) < 0.97


def test_a_split_tables_shards_are_on_distinct_devices_after_the_policy_re_places_them():
    """The policy places a task of shards not knowing which are one table's: on task 7, cut
    t1 in two and it stacks both halves on device 0 (the defect this guards against). The
    search never takes such a placement: on every small task, each split table's shards
    are on distinct devices."""
    task = _small_task(7)
    stacked = shard_task(task, {"t1": 2})
    placement = _AdditiveAgent().place(stacked.shards)
    assert [d for k, d in enumerate(placement) if stacked.owner[k] == 1] == [0, 0]
    for seed in range(16):
        _check_plan(_small_task(seed), plan_with_splits(_AdditiveAgent(), _small_task(seed)))


class _AdditiveAgent:
    """A stand-in agent (a ``PlacementAgent``) whose device cost is the sum of its tables'
    ``dim x pooling`` and whose policy places tables largest-cost first on the least
    loaded device with room."""

    meta: dict = {}
    last_report = None
    calibration_enabled = False

    @property
    def without_measuring(self):
        return self

    def prepare(self, task, sources=None):
        pass

    def table_costs(self, task):
        return [t.dim * t.pooling_factor for t in task.tables]

    def place(self, task, mode="greedy", num_samples=16, seed=0, sources=None):
        costs = self.table_costs(task)
        load, free = [0.0] * task.num_devices, list(task.memory)
        placement = [0] * len(task.tables)
        for i in sorted(range(len(task.tables)), key=lambda i: -costs[i]):
            legal = [d for d in range(task.num_devices) if free[d] >= task.tables[i].size_bytes]
            if not legal:
                raise ValueError(f"table {task.tables[i].name!r} fits on no device")
            d = min(legal, key=lambda x: load[x])
            placement[i], load[d], free[d] = (
                d,
                load[d] + costs[i],
                free[d] - task.tables[i].size_bytes,
            )
        return placement

    def predict(self, task, placement):
        from torchrec_dreamshard.policy import CostPrediction

        load = [0.0] * task.num_devices
        for c, d in zip(self.table_costs(task), placement, strict=True):
            load[d] += c
        zeros = [0.0] * task.num_devices
        return CostPrediction(fwd_ms=load, bwd_ms=zeros, comm_ms=zeros[:], step_ms=max(load))


def test_the_search_splits_a_dominant_table_when_the_cost_model_says_it_pays():
    tables = [_table("hot", rows=1000, dim=128, pf=40.0)] + [
        _table(f"t{i}", rows=1000, dim=16, pf=2.0) for i in range(8)
    ]
    task = _task(tables, devices=4, factor=3.0)
    plan = plan_with_splits(_AdditiveAgent(), task)
    assert plan.whole_ms == 128 * 40.0  # the hot table alone sets the step
    assert plan.sharded.counts["hot"] >= 4 and plan.predicted_ms < 0.5 * plan.whole_ms
    _check_plan(task, plan)
    narrow = plan_with_splits(_AdditiveAgent(), task, splittable={"hot": 64})
    assert narrow.sharded.counts == {"hot": 2}  # shards of at least 64 columns


class _BusyLinkAgent(_AdditiveAgent):
    """:class:`_AdditiveAgent` whose last device also spends :attr:`COMM` on communication,
    so that its all-to-all, not any device's compute, sets the step."""

    COMM = 10_000.0

    def predict(self, task, placement):
        from torchrec_dreamshard.policy import CostPrediction

        pred = super().predict(task, placement)
        comm = [0.0] * (task.num_devices - 1) + [self.COMM]
        total = [f + c for f, c in zip(pred.fwd_ms, comm, strict=True)]
        return CostPrediction(
            fwd_ms=pred.fwd_ms, bwd_ms=pred.bwd_ms, comm_ms=comm, step_ms=max(total)
        )


def test_the_search_splits_a_dominant_table_when_communication_sets_the_step():
    tables = [_table("hot", rows=1000, dim=128, pf=40.0)] + [
        _table(f"t{i}", rows=1000, dim=16, pf=2.0) for i in range(8)
    ]
    task = _task(tables, devices=4, factor=3.0)
    agent = _BusyLinkAgent()
    plan = plan_with_splits(agent, task)
    assert plan.sharded.counts.get("hot", 1) >= 2  # the compute everyone waits for falls
    assert plan.predicted_ms <= plan.whole_ms  # at no higher a step
    shards = plan.sharded.shards
    before = agent.predict(task, agent.place(task))
    after = agent.predict(shards, plan.placement)
    assert max(after.fwd_ms) < 0.97 * max(before.fwd_ms)
    _check_plan(task, plan)


def test_trial_splits_leave_the_whole_plan_report_and_do_not_recalibrate(monkeypatch):
    """The split search re-places trial shard tasks; a plan that stays whole keeps the
    safety-net report of its own placement, and a calibrating agent calibrates once."""
    from torchrec_dreamshard.calibration import CalibratingAgent, calibrating_agent

    tables = [_table(f"t{i}", rows=800 * (i + 1), dim=64, pf=2.0 + i) for i in range(8)]
    task = _task(tables, devices=4, factor=2.0)
    agent = DreamShard.untrained(seed=0)
    calls = []
    place = DreamShard.place

    def spy(self, t, *args, **kwargs):
        calls.append(len(t.tables))
        return place(self, t, *args, **kwargs)

    monkeypatch.setattr(DreamShard, "place", spy)
    plan = plan_with_splits(agent, task)
    assert not plan.sharded.columns  # the untrained model keeps these tables whole
    assert any(n > len(tables) for n in calls)  # but it tried tasks of shards
    assert all(len(c.placement) == len(tables) for c in agent.last_report.candidates)

    runs, real = [], calibrating_agent.plan_task
    monkeypatch.setattr(
        calibrating_agent, "plan_task", lambda *a, **k: runs.append(1) or real(*a, **k)
    )
    plan_with_splits(CalibratingAgent(agent, calibration=None), task)
    assert len(runs) == 1  # the trial placements went to the calibrated agent directly
