"""The placers' registry (``evaluation.placers``): one interface by name, memory respected,
TorchRec's planner, DreamShard's modes, measured-greedy; and the measured search."""

from __future__ import annotations

import numpy as np
import pytest

from torchrec_dreamshard.data.sampler import TaskSampler
from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import NoPlanError, Task, check_placement
from torchrec_dreamshard.evaluation import placers
from torchrec_dreamshard.evaluation.placers import PLACERS, PlacingInputs, place, plan_each
from torchrec_dreamshard.policy.heuristics import HEURISTICS, PROXIES

from harness.measured_search import measured_search


@pytest.fixture(scope="module")
def sampler():
    return TaskSampler(synthetic_pool(200, scale=CPU_POOL_SCALE), seed=4)


def _fake_single_ms(spec, batch_size, config) -> float:  # a table's "measured" cost: its dim
    return float(spec.dim)


@pytest.fixture
def fake_kernels(monkeypatch):
    """measured_greedy's kernels replaced by each table's dim (no measuring)."""
    monkeypatch.setattr(placers, "single_ms", _fake_single_ms)


AGENT_FREE = ["random", *HEURISTICS, "measured_greedy"]


def test_the_registry_names_every_placer():
    agent_modes = ["dreamshard", "dreamshard_split", "dreamshard_greedy", "dreamshard_search"]
    expected = [*AGENT_FREE, "torchrec", "torchrec_ours", *agent_modes]
    assert sorted(PLACERS) == sorted(expected)


@pytest.mark.usefixtures("fake_kernels")
@pytest.mark.parametrize("name", AGENT_FREE)
@pytest.mark.parametrize("factor", [1.05, 1.5])
def test_memory_respected(sampler, name, factor):
    for devices in (2, 4, 8):
        task = sampler.sample("test", 40, devices, memory_factor=factor)
        check_placement(task, place(name, task, seed=1))


@pytest.mark.parametrize("mode", ["dreamshard", "dreamshard_greedy", "dreamshard_search"])
def test_dreamshards_modes_place_with_the_agent(sampler, agent, mode):
    task = sampler.sample("test", 12, 4, memory_factor=1.2)
    inputs = PlacingInputs(agent=agent, num_samples=2)
    agent_mode = {"dreamshard": "safe"}.get(mode, mode.removeprefix("dreamshard_"))
    expected = agent.place(task, mode=agent_mode, num_samples=2, seed=3)
    assert place(mode, task, seed=3, inputs=inputs) == expected
    with pytest.raises(ValueError, match="needs an agent"):
        place(mode, task)


def test_the_split_mode_returns_the_columns_it_cut(agent):
    tables = [TableSpec(name=f"t{i}", rows=1000, dim=64, pooling_factor=1.0) for i in range(3)]
    big = TableSpec(name="big", rows=4000, dim=64, pooling_factor=1.0)
    memory = int(0.6 * big.size_bytes) + tables[0].size_bytes
    task = Task(
        tables=[big, *tables],
        num_devices=4,
        memory_bytes=memory,
        batch_size=64,
        allow_oversized=True,
    )
    plan = place("dreamshard_split", task, inputs=PlacingInputs(agent=agent))
    assert isinstance(plan, dict) and plan["columns"]["big"] >= 2
    assert len(plan["placement"]) == len(task.tables) - 1 + plan["columns"]["big"]
    whole = Task(tables=tables, num_devices=2, memory_bytes=10**9, batch_size=64)
    assert isinstance(place("dreamshard_split", whole, inputs=PlacingInputs(agent=agent)), list)


def dims_task() -> Task:
    """Five tables whose dims (64, 32, 32, 16, 16) split evenly over 2 devices only one way
    up to symmetry: 80 and 80."""
    tables = [
        TableSpec(name=f"t{i}", rows=100, dim=d, pooling_factor=1.0)
        for i, d in enumerate([64, 32, 32, 16, 16])
    ]
    return Task(tables=tables, num_devices=2, memory_bytes=10**9, batch_size=16)


def dim_loads(task: Task, placement: list[int]) -> list[float]:
    return sorted(np.bincount(placement, weights=[t.dim for t in task.tables], minlength=2))


def test_measured_greedy_balances_the_measured_costs(fake_kernels):
    task = dims_task()  # the fake kernels time a table by its dim
    assert dim_loads(task, place("measured_greedy", task)) == [80, 80]


def test_greedy_balances_its_proxy():
    task = dims_task()
    assert dim_loads(task, place("dim_greedy", task)) == [80, 80]


def test_proxies():
    t = TableSpec(name="t", rows=1000, dim=8, pooling_factor=2.0)
    assert PROXIES["lookup"](t) == 16.0
    assert PROXIES["size_lookup"](t) == pytest.approx(48.0)


def test_unknown_name(sampler):
    with pytest.raises(ValueError, match="unknown placer 'magic'"):
        place("magic", sampler.sample("test", 5, 2))


@pytest.mark.parametrize("name", ["random", "size_greedy"])
def test_no_room_is_an_error(name):
    tables = [TableSpec(name=f"big{i}", rows=15, dim=1, pooling_factor=1.0) for i in range(3)]
    task = Task(tables=tables, num_devices=2, memory_bytes=100, batch_size=8)
    with pytest.raises(NoPlanError, match="big"):
        place(name, task)


def test_plan_each_keeps_going_past_a_placer_without_a_plan(monkeypatch):
    tables = [TableSpec(name=f"t{i}", rows=100, dim=8, pooling_factor=1.0) for i in range(4)]
    task = Task(tables=tables, num_devices=2, memory_bytes=10**6, batch_size=8)

    def no_plan(task, seed, inputs):
        raise NoPlanError("nothing fits")

    monkeypatch.setitem(placers.PLACERS, "torchrec", no_plan)
    plans, secs = plan_each(["torchrec", "random", "random"], task, 5, labels=["tr", "r5", "r"])
    assert plans["tr"] is None and secs["tr_error"] == "nothing fits"
    assert plans["r5"] == plans["r"] == place("random", task, seed=5)
    assert all(secs[k] >= 0 for k in ("tr", "r5", "r"))


def test_torchrec_planner(sampler):
    loose = sampler.sample("test", 20, 4, memory_factor=4.0)
    check_placement(loose, place("torchrec", loose))
    tight = sampler.sample("test", 20, 4, memory_factor=1.2)
    with pytest.raises(NoPlanError, match="TorchRec"):
        place("torchrec", tight)
    check_placement(tight, place("torchrec_ours", tight))


def test_measured_search_improves_a_fake_measurement():
    """From a start that leaves two of four devices empty, the search must move tables
    (accepting only measured improvements) to within 25% of the balanced lower bound."""
    sampler = TaskSampler(synthetic_pool(200, scale=CPU_POOL_SCALE), seed=4)  # its own draw
    task = sampler.sample("test", 16, 4, memory_factor=4.0)  # any half of the tables fits

    def measure(task, placement):  # step = max device dim (a stand-in for the hardware)
        per = np.bincount(placement, weights=[t.dim for t in task.tables], minlength=4)
        return float(per.max()), per.tolist()

    start = check_placement(task, [0] * 8 + [1] * 8)
    res = measured_search(task, [start], measure, budget=60, seed=0)
    dims = [t.dim for t in task.tables]
    bound = max(sum(dims) / 4, max(dims))
    assert res.measurements <= 60
    assert res.step_ms == measure(task, res.placement)[0]  # the figure is the placement's
    assert res.step_ms <= 1.25 * bound < measure(task, start)[0]
    assert res.history == sorted(res.history, reverse=True)
