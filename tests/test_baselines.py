"""Baselines: one interface, memory respected, TorchRec's planner, measured search."""

from __future__ import annotations

import numpy as np
import pytest

from torchrec_dreamshard.data.sampler import TaskSampler
from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task, check_placement
from torchrec_dreamshard.planner import baselines


@pytest.fixture(scope="module")
def sampler():
    return TaskSampler(synthetic_pool(200, scale=CPU_POOL_SCALE), seed=4)


FAST = [n for n in baselines.BASELINES if not n.startswith("torchrec")]


@pytest.mark.parametrize("name", FAST)
@pytest.mark.parametrize("factor", [1.05, 1.5])
def test_memory_respected(sampler, name, factor):
    for devices in (2, 4, 8):
        task = sampler.sample("test", 40, devices, memory_factor=factor)
        check_placement(task, baselines.place(name, task, seed=1))


def test_greedy_balances_its_proxy():
    tables = [
        TableSpec(name=f"t{i}", rows=100, dim=d, pooling_factor=1.0)
        for i, d in enumerate([64, 32, 32, 16, 16])
    ]
    task = Task(tables=tables, num_devices=2, memory_bytes=10**9, batch_size=16)
    placement = baselines.place("dim_greedy", task)
    loads = np.bincount(placement, weights=[t.dim for t in tables], minlength=2)
    assert sorted(loads) == [80, 80]


def test_proxies():
    t = TableSpec(name="t", rows=1000, dim=8, pooling_factor=2.0)
    assert baselines.PROXIES["lookup"](t) == 16.0
    assert baselines.PROXIES["size_lookup"](t) == pytest.approx(48.0)


def test_unknown_name(sampler):
    with pytest.raises(ValueError, match="unknown baseline"):
        baselines.place("magic", sampler.sample("test", 5, 2))


def test_no_room_is_an_error():
    tables = [TableSpec(name=f"big{i}", rows=15, dim=1, pooling_factor=1.0) for i in range(3)]
    task = Task(tables=tables, num_devices=2, memory_bytes=100, batch_size=8)
    with pytest.raises(baselines.NoPlanError, match="big"):
        baselines.place("size_greedy", task)


def test_torchrec_planner(sampler):
    loose = sampler.sample("test", 20, 4, memory_factor=4.0)
    check_placement(loose, baselines.place("torchrec", loose))
    tight = sampler.sample("test", 20, 4, memory_factor=1.2)
    with pytest.raises(baselines.NoPlanError, match="TorchRec"):
        baselines.place("torchrec", tight)
    check_placement(tight, baselines.place("torchrec_ours", tight))


def test_measured_search_improves_a_fake_measurement(sampler):
    """From a start that leaves two of four devices empty, the search must move tables
    (accepting only measured improvements) to within 25% of the balanced lower bound."""
    task = sampler.sample("test", 16, 4, memory_factor=4.0)  # any half of the tables fits

    def measure(task, placement):  # step = max device dim (a stand-in for the hardware)
        per = np.bincount(placement, weights=[t.dim for t in task.tables], minlength=4)
        return float(per.max()), per.tolist()

    start = check_placement(task, [0] * 8 + [1] * 8)
    res = baselines.measured_search(task, [start], measure, budget=60, seed=0)
    dims = [t.dim for t in task.tables]
    bound = max(sum(dims) / 4, max(dims))
    assert res.measurements <= 60
    assert res.step_ms == measure(task, res.placement)[0]  # the figure is the placement's
    assert res.step_ms <= 1.25 * bound < measure(task, start)[0]
    assert res.history == sorted(res.history, reverse=True)
