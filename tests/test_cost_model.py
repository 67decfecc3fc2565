"""The cost network: exact physical sums, monotone in tables and lookups, invariant to
table and device order, an ensemble spread, a fit that recovers a physical law, metrics."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from torchrec_dreamshard.cost import cost_net as M
from torchrec_dreamshard.cost import fitting as P
from torchrec_dreamshard.cost.cost_net import CostNet
from torchrec_dreamshard.cost.fitting import kendall_tau, mape
from torchrec_dreamshard.cost.physics import NUM_QUANTITIES, table_quantities
from torchrec_dreamshard.data.sampler import TaskSampler
from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.policy import DreamShard


@pytest.fixture(scope="module")
def task():
    sampler = TaskSampler(synthetic_pool(120, scale=CPU_POOL_SCALE), seed=1)
    return sampler.sample("train", 24, 4, memory_factor=5.0)


def test_device_prediction_ignores_table_order(task):
    agent = DreamShard.untrained(seed=3)
    placement = [i % 4 for i in range(len(task.tables))]
    base = agent.predict(task, placement)
    perm = np.random.default_rng(0).permutation(len(task.tables))
    shuffled = type(task)(
        tables=[task.tables[i] for i in perm],
        num_devices=task.num_devices,
        memory_bytes=task.memory_bytes,
        batch_size=task.batch_size,
    )
    other = agent.predict(shuffled, [placement[i] for i in perm])
    np.testing.assert_allclose(other.fwd_ms, base.fwd_ms, rtol=1e-5)
    np.testing.assert_allclose(other.comm_ms, base.comm_ms, rtol=1e-5)
    assert other.step_ms == pytest.approx(base.step_ms, rel=1e-5)


def test_overall_prediction_ignores_device_order(task):
    agent = DreamShard.untrained(seed=4)
    placement = [i % 4 for i in range(len(task.tables))]
    relabel = [2, 0, 3, 1]
    a = agent.predict(task, placement)
    b = agent.predict(task, [relabel[d] for d in placement])
    assert b.step_ms == pytest.approx(a.step_ms, rel=1e-5)
    for d in range(4):
        assert b.bwd_ms[relabel[d]] == pytest.approx(a.bwd_ms[d], rel=1e-5)


def test_empty_devices_cost_nothing(task):
    agent = DreamShard.untrained()
    pred = agent.predict(task, [0] * len(task.tables))
    assert pred.fwd_ms[1:] == [0.0, 0.0, 0.0]
    assert pred.fwd_ms[0] > 0


def _tables(n: int, seed: int = 0) -> list[TableSpec]:
    rng = np.random.default_rng(seed)
    return [
        TableSpec(
            name=f"t{i}",
            rows=int(rng.integers(100, 200_000)),
            dim=int(rng.choice([8, 16, 32, 64, 128])),
            pooling_factor=float(rng.uniform(1, 40)),
        )
        for i in range(n)
    ]


def _device_costs(net: M.CostNet, tables: list[TableSpec], B: int = 2048) -> torch.Tensor:
    enc = net.encode(torch.from_numpy(M.cost_inputs(tables, B)))
    return net.member_compute(enc.sum(0))  # [K, 2]


@pytest.mark.parametrize("seed", range(5))
def test_adding_a_table_never_makes_a_device_cheaper(seed):
    torch.manual_seed(seed)
    net = M.CostNet(hidden=8, members=3)
    with torch.no_grad():  # a trained-looking net: large, varied weights
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 2.0)
    tables = _tables(12, seed)
    before = _device_costs(net, tables[:-1])
    after = _device_costs(net, tables)
    assert torch.all(after >= before - 1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_more_lookups_never_make_a_device_cheaper(seed):
    torch.manual_seed(seed)
    net = M.CostNet(hidden=8, members=3)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 2.0)
    tables = _tables(6, seed)
    busier = [
        *tables[:-1],
        dataclasses.replace(tables[-1], pooling_factor=tables[-1].pooling_factor * 3),
    ]
    assert torch.all(_device_costs(net, busier) >= _device_costs(net, tables) - 1e-6)


def test_quantities_sum_exactly_and_grow_with_lookups():
    tables = _tables(5)
    q = table_quantities(tables, 2048)
    assert q.shape == (5, NUM_QUANTITIES) and np.all(q >= 0)
    more = table_quantities([dataclasses.replace(tables[0], pooling_factor=80.0)], 2048)[0]
    assert tables[0].pooling_factor < 80.0 and np.all(more >= q[0] - 1e-6)
    net = M.CostNet(hidden=4, members=2)
    enc = net.encode(torch.from_numpy(M.cost_inputs(tables, 2048)))
    # the device state's physical part is exactly the sum of the tables' quantities
    assert torch.allclose(enc.sum(0)[:NUM_QUANTITIES], torch.from_numpy(q.sum(0)), rtol=1e-5)


def test_prediction_ignores_table_and_device_order():
    torch.manual_seed(0)
    net = M.CostNet(hidden=8, members=3)
    tables = _tables(10)
    placement = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    per = [(1.0, 1.0, 0.5)] * 3
    s1 = P.sample_from_measurement("g", tables, placement, 3, 2048, per)
    perm = np.random.default_rng(1).permutation(10)
    dev_perm = [2, 0, 1]
    s2 = P.sample_from_measurement(
        "g", [tables[i] for i in perm], [dev_perm[placement[i]] for i in perm], 3, 2048, per
    )
    _, step1, std1 = P.predict_samples(net, [s1])
    _, step2, std2 = P.predict_samples(net, [s2])
    assert step1[0] == pytest.approx(step2[0], rel=1e-5)
    assert std1[0] == pytest.approx(std2[0], rel=1e-4, abs=1e-6)


def _law(tables: list[TableSpec], B: int) -> tuple[float, float]:
    """A made-up physical law: fwd and bwd linear in gathered/updated elements."""
    q = table_quantities(tables, B).sum(0)
    fwd = 0.05 + 0.2 * q[2] + 0.05 * q[0]
    bwd = 0.08 + 0.3 * q[2] + 0.4 * q[4]
    return float(fwd), float(bwd)


def test_fit_recovers_a_physical_law_beyond_the_training_range():
    rng = np.random.default_rng(0)
    pool = _tables(200, seed=3)

    def sample(n_lo, n_hi, k):
        idx = rng.choice(len(pool), int(rng.integers(n_lo, n_hi)), replace=False)
        tables = [pool[i] for i in idx]
        fwd, bwd = _law(tables, 2048)
        return P.sample_from_measurement(
            f"s{k}", tables, [0] * len(tables), 1, 2048, [(fwd, bwd, 0.0)]
        )

    train = [sample(1, 10, k) for k in range(120)]
    test = [sample(20, 40, k) for k in range(20)]  # twice as many tables as training saw
    torch.manual_seed(0)
    net = M.CostNet(hidden=8, members=3)
    hist = P.fit_cost_model(net, train, epochs=300, lr=2e-2)
    assert hist[-1] < hist[0] / 5
    dev, _, std = P.predict_samples(net, test)
    true = np.concatenate([s.dev_ms for s in test])
    err = np.abs(dev[:, :2] - true[:, :2]) / true[:, :2]
    assert np.median(err) < 0.10
    assert np.all(std >= 0)


def test_members_disagree_and_are_bootstrapped_apart():
    torch.manual_seed(0)
    net = M.CostNet(hidden=8, members=4)
    tables = _tables(8)
    s = P.sample_from_measurement("g", tables, [0, 1] * 4, 2, 2048, [(1, 1, 0.5)] * 2)
    _, _, std = P.predict_samples(net, [s])
    assert std[0] > 0


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="members"):
        M.CostNet(hidden=4, members=0)


def test_metrics():
    assert mape([110.0, 90.0], [100.0, 100.0]) == pytest.approx(10.0)
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert np.isnan(kendall_tau([1], [1]))


def test_log_comm_is_the_latency_bandwidth_form():
    """``m = p (D - 1) + q (W + (D - 2) w) / (1000 D) + r``, and none on one device."""
    import math

    from torch.nn import functional as F

    from torchrec_dreamshard.cost.cost_net import NO_COMM_LOG, device_context

    net = CostNet(8, 2)
    p, q, r = F.softplus(net.comm_raw).detach().tolist()
    for D, W, w in ((2, 96, 32), (4, 512, 64), (8, 1000, 0)):
        got = net.log_comm(torch.tensor(float(w)), device_context(D, W)).item()
        want = math.log(p * (D - 1) + q * (W + (D - 2) * w) / (1000 * D) + r)
        assert got == pytest.approx(want, rel=1e-5)
    one = net.log_comm(torch.tensor(64.0), device_context(1, 64)).item()
    assert one == pytest.approx(NO_COMM_LOG)


@pytest.mark.parametrize("members,hidden", [(5, 16), (1, 8), (3, 4)])
def test_frozen_heads_give_the_networks_values(members, hidden):
    """Planning evaluates the heads through ``FrozenHeads`` (weights transformed once, one
    bmm per ensemble product): the same values as the network's own methods, up to float32
    rounding (another order of operations), on every shape the planner uses (one state, a
    roll-out's, a refinement's batch)."""
    torch.manual_seed(members)
    net = CostNet(hidden, members)
    with torch.no_grad():
        for D, width in [(1, 30), (2, 100), (8, 900), (64, 5000)]:
            ctx = M.device_context(D, width)
            heads = M.FrozenHeads(net, ctx)
            for lead in [(), (D,), (1, D), (4, D), (50, D), (3, 2, D), (0, D)]:
                S = torch.rand(*lead, net.enc_dim) * 40
                # log costs: a few float32 ulps apart at most; a wrong weight or context
                # would move them by far more
                close = {"rtol": 1e-5, "atol": 1e-5}
                torch.testing.assert_close(
                    heads.member_device_log_costs(S), net.member_device_log_costs(S, ctx), **close
                )
                torch.testing.assert_close(
                    heads.device_log_costs(S), net.device_log_costs(S, ctx), **close
                )


def test_cost_inputs_rows_are_each_tables_own_inputs():
    """Rows are cached per table: a task's inputs are each table's alone, in order."""
    tables = _tables(6)
    B = 2048
    together = M.cost_inputs(tables, B)
    for i, t in enumerate(tables):
        np.testing.assert_array_equal(together[i], M.cost_inputs([t], B)[0])
    np.testing.assert_array_equal(M.cost_inputs(tables[::-1], B), together[::-1])
    assert M.cost_inputs([], B).shape == (0, M.INPUT_DIM)
    assert not np.array_equal(M.cost_inputs(tables, 4 * B), together)
