"""The reference kernel on this machine: the cost network's kernels brought to its time
where the type choice sets them beside costs measured here."""

from __future__ import annotations

import json
import warnings

import pytest
from torchrec.distributed.planner.types import Topology

from torchrec_dreamshard.cache import reference_time as rt
from torchrec_dreamshard.cost.dense_kernel_model import DenseKernelModel
from torchrec_dreamshard.cost.plans import cost_network_kernel
from torchrec_dreamshard.measure import reference_speed as rs
from torchrec_dreamshard.measure.embedding_kernels import REFERENCE_BATCH_SIZE, REFERENCE_TABLES
from torchrec_dreamshard.planner.type_choice.type_choice import TypeChooser
from torchrec_dreamshard.policy.checkpoint import load_checkpoint


@pytest.fixture(scope="module")
def agent():
    return load_checkpoint(None)


def predicted_reference(agent) -> tuple[float, float]:
    return cost_network_kernel(agent)(list(REFERENCE_TABLES), REFERENCE_BATCH_SIZE)


def chooser(agent, reference_ms, **kw) -> TypeChooser:
    from conftest import GLOO_LIKE

    topo = Topology(world_size=2, compute_device="cpu")
    return TypeChooser(agent, topo, 1024, None, GLOO_LIKE, None, reference_ms, **kw)


def test_kernels_are_priced_in_this_machines_time(agent):
    """A machine 3x slower forward and 10x slower backward on the reference kernel: every
    fused kernel the choice prices is 3x and 10x the network's prediction."""
    f, b = predicted_reference(agent)
    c = chooser(agent, (3 * f, 10 * b))
    assert c.speed == pytest.approx((3.0, 10.0))
    tables = list(REFERENCE_TABLES[:2])
    raw = cost_network_kernel(agent)(tables, 512)
    assert c.ctx.kernel_ms(tables, 512) == pytest.approx((3 * raw[0], 10 * raw[1]))
    assert c.ctx.kernels_ms([(tables, 512)])[0] == pytest.approx((3 * raw[0], 10 * raw[1]))
    assert chooser(agent, None).speed == (1.0, 1.0)


def test_a_calibrating_agent_is_not_scaled(agent):
    from torchrec_dreamshard.calibration import CalibratingAgent, CalibrationConfig

    calibrating = CalibratingAgent(agent, CalibrationConfig(budget_s=1.0))
    assert chooser(calibrating, (100.0, 100.0)).speed == (1.0, 1.0)


def test_a_slower_backward_here_replicates_what_the_prediction_keeps_table_wise(agent, monkeypatch):
    """Same collectives and dense kernel: priced as predicted the tiny tables stay
    table-wise; on a machine whose fused backward is 30x the prediction most are
    replicated (their dense kernel was measured here, the fused one was not)."""
    from test_type_choice import models, plan_types

    from torchrec_dreamshard.planner.steps import machine_sources

    dense = DenseKernelModel(fwd=(0.0, 0.04, 0, 0, 0), bwd=(0.0, 0.04, 0, 0, 1.0))
    f, b = predicted_reference(agent)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # calibrate=False: the prediction scaled to this machine's time, not calibrated
        _, as_predicted = plan_types(agent, models(0.0, 0.5), dense_kernel=dense, calibrate=False)
        monkeypatch.setattr(machine_sources, "load_reference_ms", lambda **kw: (f, 30 * b))
        _, here = plan_types(agent, models(0.0, 0.5), dense_kernel=dense, calibrate=False)
    tiny = [f"tiny{i}" for i in range(12)]
    assert {as_predicted[t] for t in tiny} == {"table_wise"}
    assert sum(here[t] == "data_parallel" for t in tiny) >= 8  # of 12, on 4 ranks


def test_the_cache_file_is_kept_and_checked(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(rs, "measure_reference_ms", lambda device: calls.append(1) or (2.0, 20.0))
    path = tmp_path / "ref.json"
    assert rt.load_reference_ms(path) == (2.0, 20.0)
    rt._LOADED.clear()
    assert rt.load_reference_ms(path) == (2.0, 20.0) and calls == [1]  # read back, not timed
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1, "fwd_ms": -1, "bwd_ms": 2}))
    with pytest.raises(ValueError, match="malformed.*delete .*bad.json"):
        rt.load_reference_ms(bad)
    assert rs.speed_ratio((2.0, 20.0), (1.0, 0.0)) == (2.0, 1.0)


@pytest.mark.slow
def test_the_reference_kernel_is_timed_here():
    fwd, bwd = rs.measure_reference_ms()
    assert 0 < fwd < 1000 and 0 < bwd < 5000
