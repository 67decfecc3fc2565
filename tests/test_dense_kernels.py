"""The dense kernel that data-parallel tables run: timed, fitted, cached, and what it
decides in the sharding-type choice."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_dreamshard.cost import dense_kernel_model as dk
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.measure import dense_kernels as dt
from torchrec_dreamshard.measure.embedding_kernels import fused_ring

TRUE_FWD = (0.05, 0.01, 0.02, 0.2, 0.01)
TRUE_BWD = (0.1, 0.005, 0.0, 0.4, 1.0)


def exact_samples() -> list:
    """Timings that follow :data:`TRUE_FWD` / :data:`TRUE_BWD` exactly."""
    out = []
    for tables, batch in dt.random_dense_sets(12, seed=3):
        x = dk.dense_features(tables, batch)
        out.append((tables, batch, float(np.dot(TRUE_FWD, x)), float(np.dot(TRUE_BWD, x))))
    return out


def test_the_fit_recovers_the_coefficients_of_exact_timings():
    model = dk.fit_dense_kernel_model(exact_samples(), "cpu", "test")
    assert model.fwd == pytest.approx(TRUE_FWD, abs=1e-9)
    assert model.bwd == pytest.approx(TRUE_BWD, abs=1e-9)
    assert model.mape == pytest.approx(0.0, abs=1e-9)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_nonnegative_lstsq_never_returns_a_negative_coefficient(seed):
    rng = np.random.default_rng(seed)
    x = np.abs(rng.normal(size=(12, 4))) + 0.01
    y = np.abs(x @ rng.normal(size=4)) + 0.1  # the unconstrained fit may go negative
    coef = dk.nonnegative_lstsq(x, y)
    assert (coef >= 0).all()
    w = 1.0 / y  # no worse, in weighted squares, than leaving every coefficient at 0
    assert np.sum(((x @ coef - y) * w) ** 2) <= np.sum((y * w) ** 2) + 1e-9


def test_coefficients_and_files_are_checked(tmp_path):
    with pytest.raises(ValueError, match="coefficients >= 0"):
        dk.DenseKernelModel(fwd=(1, 1, 1, 1, -1), bwd=(0, 0, 0, 0, 0))
    with pytest.raises(ValueError, match="5 coefficients"):
        dk.DenseKernelModel(fwd=(1, 1), bwd=(0, 0, 0, 0, 0))
    path = tmp_path / "dense.json"
    model = dk.fit_dense_kernel_model(exact_samples(), "cpu", "test")
    path.write_text(json.dumps(model.to_dict()))
    assert dk.load_dense_kernel_model(path).fwd == model.fwd
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 99}))
    with pytest.raises(ValueError, match="format version 1.*delete"):
        dk.load_dense_kernel_model(bad)


def test_many_tiny_tables_cost_what_their_sum_says():
    model = dk.DenseKernelModel(fwd=TRUE_FWD, bwd=TRUE_BWD)
    tiny = [TableSpec(name=f"t{i}", rows=100, dim=8, pooling_factor=2.0) for i in range(10)]
    one = model.ms(tiny[:1], 512)
    ten = model.ms(tiny, 512)
    # one kernel: its constant is paid once, the rest scales with the tables
    for k, constant in enumerate((TRUE_FWD[0], TRUE_BWD[0])):
        assert ten[k] == pytest.approx(constant + 10 * (one[k] - constant))
    assert model.ms([], 512) == (0.0, 0.0)


@pytest.mark.slow
def test_the_model_fitted_here_predicts_dense_kernels_it_did_not_see(tmp_path):
    """Fitted on this machine's real FBGEMM dense kernel, it predicts other table sets
    within 50% (median relative error of forward + backward and update; a shared machine
    moves single timings by tens of percent, a wrong model is off by multiples)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = dk.load_dense_kernel_model(tmp_path / "dense.json")
        assert (tmp_path / "dense.json").exists() and model.samples >= 20
        errors = []
        for tables, batch in dt.random_dense_sets(8, seed=11):
            fwd, bwd = dt.time_dense_kernel(tables, batch)
            pf, pb = model.ms(tables, batch)
            errors.append(abs(pf + pb - fwd - bwd) / (fwd + bwd))
    assert float(np.median(errors)) < 0.5, errors


def test_the_dense_kernels_cost_decides_whether_tiny_tables_are_replicated():
    """Same collectives, same cost network: a dense kernel cheaper than the fused one
    replicates the tiny tables; one that costs 50 ms a table keeps them table-wise."""
    from test_type_choice import models, plan_types

    from torchrec_dreamshard.policy.checkpoint import load_checkpoint

    agent = load_checkpoint(None)
    cheap = dk.DenseKernelModel(fwd=(0.0,) * 5, bwd=(0.0,) * 5)
    dear = dk.DenseKernelModel(fwd=(0, 50.0, 0, 0, 0), bwd=(0,) * 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, cheap_types = plan_types(agent, models(0.0, 2.0), dense_kernel=cheap)
        _, dear_types = plan_types(agent, models(0.0, 2.0), dense_kernel=dear)
    tiny = [f"tiny{i}" for i in range(12)]
    assert {cheap_types[t] for t in tiny} == {"data_parallel"}
    assert {dear_types[t] for t in tiny} == {"table_wise"}


def test_the_timed_dense_kernel_computes_the_gradient_plain_autograd_does():
    """PyTorch warns that FBGEMM's dense kernel has no autograd kernel registered ("may lead
    to silently incorrect behavior"). What the timer times must still be the real backward:
    the forward and the weights' gradient agree with ``embedding_bag``'s autograd, and the
    timer's backward raises no warning."""
    import torch

    tables = [
        TableSpec(name="a", rows=300, dim=8, pooling_factor=3.0),
        TableSpec(name="b", rows=50, dim=16, pooling_factor=5.0),
    ]
    emb = dt.dense_kernel(tables)
    ids, offsets = fused_ring(tables, 16, 0, 1)[0]
    out = emb(ids, offsets)
    grad = torch.randn_like(out)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dt.backward_through(out, grad)
    assert not [w for w in caught if "autograd kernel" in str(w.message)]

    refs, weights, start = [], [], 0
    batch = (len(offsets) - 1) // len(tables)  # table-major: one bag per table and sample
    for i, t in enumerate(tables):
        w = emb.weights.detach()[start : start + t.rows * t.dim].view(t.rows, t.dim)
        w = w.clone().requires_grad_(True)
        start += t.rows * t.dim
        bags = offsets[i * batch : (i + 1) * batch + 1]
        lo, hi = int(bags[0]), int(bags[-1])
        refs.append(torch.nn.functional.embedding_bag(ids[lo:hi], w, bags[:-1] - lo, mode="sum"))
        weights.append(w)
    ref = torch.cat(refs, dim=1)
    # The same sums in the same order: equal up to float rounding of a few terms.
    torch.testing.assert_close(out.detach(), ref.detach(), rtol=1e-5, atol=1e-6)
    ref.backward(grad)
    expected = torch.cat([w.grad.flatten() for w in weights])
    torch.testing.assert_close(emb.weights.grad, expected, rtol=1e-5, atol=1e-6)
    assert emb.weights.grad.abs().sum() > 0
