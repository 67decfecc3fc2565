"""The collective models: one latency-bandwidth fit per collective, cached per machine."""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest

from torchrec_dreamshard.cost import collective_models as coll
from torchrec_dreamshard.cost.collective_models import CollectiveModels, fit_collective_models
from torchrec_dreamshard.cost.comm_model import CommModel
from torchrec_dreamshard.measure.collective_timing import (
    CALIBRATION_BYTES,
    COLLECTIVES,
    wire_megabytes,
)

MODELS = CollectiveModels(
    backend="gloo",
    models={k: CommModel(0.2, 0.5 + i, 0.8, source="test") for i, k in enumerate(COLLECTIVES)},
)


def test_wire_megabytes_puts_every_collective_on_one_axis():
    s = 4e6
    assert wire_megabytes("all_to_all", 4, s) == pytest.approx(2 * 3 / 4 * 4)
    assert wire_megabytes("reduce_scatter", 4, s) == wire_megabytes("all_gather", 4, s)
    assert wire_megabytes("all_reduce", 4, s) == pytest.approx(
        2 * wire_megabytes("all_gather", 4, s)
    )
    assert wire_megabytes("all_reduce", 1, s) == 0.0
    with pytest.raises(ValueError, match="unknown collective 'broadcast'"):
        wire_megabytes("broadcast", 2, s)


def test_fit_recovers_each_collectives_coefficients_and_round_trips():
    rng = np.random.default_rng(0)
    truth = {k: (0.1 * (i + 1), 0.5 + i, 0.2 * (i + 1)) for i, k in enumerate(COLLECTIVES)}
    samples = [
        (k, d, mb, a + b * (d - 1) + c * mb)
        for k, (a, b, c) in truth.items()
        for d in (2, 3, 4)
        for mb in rng.uniform(0.01, 8.0, size=4)
    ]
    fitted = fit_collective_models(samples, "gloo", "synthetic")
    for k, coefs in truth.items():
        m = fitted.models[k]
        assert (m.latency_ms, m.per_peer_ms, m.ms_per_mb) == pytest.approx(coefs, abs=1e-9)
    again = CollectiveModels.from_dict(json.loads(json.dumps(fitted.to_dict())))
    assert again.to_dict() == fitted.to_dict()
    with pytest.raises(ValueError, match="format version 1, got 0"):
        CollectiveModels.from_dict({**fitted.to_dict(), "version": 0})
    with pytest.raises(ValueError, match="lack \\['all_reduce'\\]"):
        CollectiveModels(backend="gloo", models={k: MODELS.models[k] for k in COLLECTIVES[:3]})


def test_cached_models_load_without_calibrating_and_the_all_to_all_is_theirs(tmp_path, monkeypatch):
    """The one all-to-all model every caller charges is the cached collective models'
    (a file the local backend's own fit left behind, before there was one model, is not
    read), or those of a file named."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(coll, "_LOADED", {})
    monkeypatch.setattr(coll, "calibrate_collective_models", _refuse)
    path = coll.default_collectives_path("gloo")
    path.parent.mkdir(parents=True)
    old = CommModel(latency_ms=0.1, per_peer_ms=0.05, ms_per_mb=0.5, source="old cache")
    (path.parent / path.name.replace("collectives_gloo", "comm_model")).write_text(
        json.dumps(asdict(old))
    )
    path.write_text(json.dumps(MODELS.to_dict()))
    assert coll.load_collective_models(backend="gloo").to_dict() == MODELS.to_dict()
    assert coll.load_all_to_all_model() == MODELS.models["all_to_all"]
    named = tmp_path / "named.json"
    other = CollectiveModels(backend="gloo", models=dict.fromkeys(COLLECTIVES, old))
    named.write_text(json.dumps(other.to_dict()))
    assert coll.load_all_to_all_model(named) == old
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 7}))
    with pytest.raises(ValueError, match="delete .*bad.json"):
        coll.load_collective_models(bad)


def _refuse(*args, **kwargs):
    raise AssertionError("must not calibrate when the cache file exists")


@pytest.mark.slow
def test_calibrated_collectives_cost_time_and_never_less_for_more_bytes(tmp_path, monkeypatch):
    from torchrec_dreamshard.ranks.spawn import measuring_ranks

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(coll, "_LOADED", {})
    models = coll.load_collective_models(backend="gloo")
    assert coll.default_collectives_path("gloo").exists()
    ranks = measuring_ranks(4)  # never more ranks than cores
    for kind in COLLECTIVES:
        m = models.models[kind]
        # every rank of each group of 2..ranks
        assert m.samples == sum(range(2, ranks + 1)) * len(CALIBRATION_BYTES)
        # a non-negative fit: on 2 ranks sharing 2 busy cores a collective of 4 MB can
        # time within the noise of one of 16 KB, and the fit then charges no bandwidth
        # (seen once under load: all_gather 3.1 ms +- 1.3, ms_per_mb 0); it never charges less
        assert m.latency_ms >= 0 and m.per_peer_ms >= 0 and m.ms_per_mb >= 0, (kind, m)
        assert m.latency_ms + m.ms_per_mb > 0, (kind, m)  # a collective is never free
        for d in (2, 3, 4):
            small, large = models.ms(kind, d, 0.1), models.ms(kind, d, 10.0)
            assert 0 < small <= large, (kind, d, small, large)
    monkeypatch.setattr(coll, "_LOADED", {})
    monkeypatch.setattr(coll, "calibrate_collective_models", _refuse)
    assert coll.load_collective_models(backend="gloo").to_dict() == models.to_dict()


def test_calibrating_refuses_unknown_rank_kinds_threads_for_nccl_and_fewer_than_two_ranks():
    with pytest.raises(ValueError, match="ranks must be one of \\('threads', 'processes'\\)"):
        coll.calibrate_collective_models(ranks="fibers")
    with pytest.raises(ValueError, match="NCCL collectives are timed on spawned processes"):
        coll.calibrate_collective_models(backend="nccl", ranks="threads")
    with pytest.raises(ValueError, match="max_devices must be >= 2, got 1"):
        coll.calibrate_collective_models(max_devices=1)


@pytest.mark.slow
def test_threads_and_spawned_processes_time_the_same_collectives():
    """Both ways of running the ranks give a fit of every collective on every group size,
    every rank's median of every size (what they measure is compared in docs/guide.md)."""
    from torchrec_dreamshard.ranks.spawn import measuring_ranks

    ranks = measuring_ranks(4)
    for how in ("threads", "processes"):
        models = coll.calibrate_collective_models(max_devices=4, backend="gloo", ranks=how)
        assert how.split()[0] in models.source.split("(")[-1], models.source
        for kind in COLLECTIVES:
            m = models.models[kind]
            assert m.samples == sum(range(2, ranks + 1)) * len(CALIBRATION_BYTES), kind
            assert models.ms(kind, 2, 10.0) > 0, (how, kind, m)


def test_collective_runs_are_interleaved_in_passes_and_their_lower_quartile_is_fitted():
    """A stall that hits some runs of a size (the scheduler on a loaded CPU) moves the
    fitted figure little: the lower quartile of every pass's runs is fitted, and every
    pass visits every kind and size before the next one starts."""
    from torchrec_dreamshard.measure import collective_timing as timing

    order: list[tuple[str, int]] = []

    def time_one(kind: str, size: int) -> list[float]:
        order.append((kind, size))
        base = 1.0 + size / 2**20
        # the first pass of every size stalled 3 ms in most of its runs
        stalled = sum(1 for k, s in order if (k, s) == (kind, size)) == 1
        return [base + (3.0 if stalled and i % 4 else 0.0) for i in range(timing.REPEATS_PER_PASS)]

    samples = timing.interleaved_samples(time_one, 2)
    per_pass = len(timing.COLLECTIVES) * len(timing.CALIBRATION_BYTES)
    assert len(order) == timing.PASSES * per_pass
    assert order[:per_pass] == order[per_pass : 2 * per_pass]  # whole passes, in turn
    for kind, d, mb, ms in samples:
        size = next(s for s in timing.CALIBRATION_BYTES if timing.wire_megabytes(kind, 2, s) == mb)
        assert d == 2 and ms == pytest.approx(1.0 + size / 2**20)
    with pytest.raises(ValueError, match="no collective runs"):
        timing.steady_ms([])
