"""Cost network: invariances, fitting, metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchrec_dreamshard.cost_fit import (
    CostSample,
    evaluate_cost_model,
    fit_cost_model,
    kendall_tau,
    mape,
    pack,
    predict_samples,
)
from torchrec_dreamshard.cost_model import CostNet, context_values
from torchrec_dreamshard.policy import DreamShard
from torchrec_dreamshard.pool import CPU_POOL_SCALE, synthetic_pool
from torchrec_dreamshard.sampler import TaskSampler


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


def _synthetic_samples(n: int, seed: int) -> list[CostSample]:
    """Device cost = sum of per-table costs (a known additive ground truth)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        feats = rng.random((8, 21)).astype(np.float32)
        per_table = 0.1 + feats[:, 0] * 2.0
        devices = [[0, 1, 2], [3, 4], [5, 6, 7]]
        dev = np.array([[per_table[g].sum(), 2 * per_table[g].sum(), 0.5] for g in devices])
        out.append(
            CostSample(f"g{k % 5}", feats, devices, context_values(3, 100), dev, dev.sum(1).max())
        )
    return out


def test_fit_lowers_the_loss_and_metrics_are_sane():
    torch.manual_seed(0)
    net = CostNet(hidden=32)
    train, held = _synthetic_samples(96, 0), _synthetic_samples(30, 1)
    before = evaluate_cost_model(net, held)["cost/mape"]
    hist = fit_cost_model(net, train, epochs=60, batch_size=32)
    after = evaluate_cost_model(net, held)
    assert hist[-1] < hist[0]
    assert after["cost/mape"] < before
    assert after["cost/mape"] < 25.0
    dev, step = predict_samples(net, held[:2])
    assert dev.shape == (6, 3) and step.shape == (2,)


def test_pack_refuses_empty_devices():
    with pytest.raises(ValueError, match="non-empty"):
        pack([(np.zeros((2, 21), np.float32), [[0, 1], []], context_values(2, 8))])


def test_metrics():
    assert mape([110.0, 90.0], [100.0, 100.0]) == pytest.approx(10.0)
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert np.isnan(kendall_tau([1], [1]))


def test_log_comm_is_the_latency_bandwidth_form():
    """``m = p (D - 1) + q (W + (D - 2) w) / (1000 D) + r``, and none on one device."""
    import math

    from torch.nn import functional as F

    from torchrec_dreamshard.cost_model import NO_COMM_LOG, CostNet, device_context

    net = CostNet(16)
    p, q, r = F.softplus(net.comm_raw).detach().tolist()
    for D, W, w in ((2, 96, 32), (4, 512, 64), (8, 1000, 0)):
        got = net.log_comm(torch.tensor(float(w)), device_context(D, W)).item()
        want = math.log(p * (D - 1) + q * (W + (D - 2) * w) / (1000 * D) + r)
        assert got == pytest.approx(want, rel=1e-5)
    one = net.log_comm(torch.tensor(64.0), device_context(1, 64)).item()
    assert one == pytest.approx(NO_COMM_LOG)
