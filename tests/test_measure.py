"""Tests of torchrec_dreamshard.measure: real FBGEMM kernels and collectives on CPU."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from torchrec_dreamshard.cost.comm_model import fit_comm_model
from torchrec_dreamshard.data.sampler import make_task
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task, check_placement
from torchrec_dreamshard.measure import (
    MeasureConfig,
    embedding_kernels,
    measure_placement,
    random_placement,
    time_fused_kernel,
)
from torchrec_dreamshard.measure import comm as comm_mod

FAST = MeasureConfig(warmup=1, iters=2, rounds=2)
pytestmark = pytest.mark.usefixtures("comm_model")  # a known all-to-all model, privately


def small_task(num_devices: int = 2, batch_size: int = 256, memory_factor: float = 1.5) -> Task:
    tables = [
        TableSpec(name=f"t{i}", rows=3000 * (i + 1), dim=8 * (1 + i % 3), pooling_factor=2.0 + i)
        for i in range(6)
    ]
    return make_task(tables, num_devices, batch_size, memory_factor)


def test_config_rejects_bad_values_with_actionable_messages():
    with pytest.raises(ValueError, match="fp16.*cuda"):
        MeasureConfig(precision="fp16")
    with pytest.raises(ValueError, match="optimizer must be one of"):
        MeasureConfig(optimizer="adam")
    with pytest.raises(ValueError, match="iters must be an integer >= 1"):
        MeasureConfig(iters=0)
    key = MeasureConfig(optimizer="sgd").workload_key(2048)
    assert key == "b2048-sgd-fp32-cpu" and key != MeasureConfig().workload_key(2048)


def test_fused_ring_gives_distinct_batches_in_fbgemm_layout():
    tables = small_task().tables[:3]
    ring = embedding_kernels.fused_ring(tables, 64, seed=0, size=3)
    for ids, offsets in ring:
        assert offsets.numel() == 3 * 64 + 1 and offsets[-1] == ids.numel()
    assert not torch.equal(ring[0][0], ring[1][0])
    again = embedding_kernels.fused_ring(tables, 64, seed=0, size=3)
    assert torch.equal(ring[2][0], again[2][0])


def test_kernel_memory_is_written_not_zero_pages():
    kernel = embedding_kernels.FusedKernel(small_task().tables[:2], 64, FAST)
    for weights in kernel.emb.split_embedding_weights():
        assert float(weights.abs().min()) > 0
    assert float(kernel.emb.momentum1_host.detach().min()) > 0


@pytest.mark.parametrize("optimizer", ["rowwise_adagrad", "sgd", "adagrad"])
def test_time_fused_kernel_is_positive_and_updates_weights(optimizer):
    from torchrec_dreamshard.measure.embedding_kernels import FusedKernel

    config = MeasureConfig(optimizer=optimizer, warmup=1, iters=2, rounds=1)
    tables = small_task().tables[:3]
    fwd, bwd = time_fused_kernel(tables, 128, config)
    assert 0 < fwd < 1e4 and 0 < bwd < 1e4
    kernel = FusedKernel(tables, 128, config)
    before = [w.clone() for w in kernel.emb.split_embedding_weights()]
    kernel.run_round(warmup=1, iters=2)  # what time_fused_kernel times: fwd + bwd + update
    after = kernel.emb.split_embedding_weights()
    for b, a in zip(before, after, strict=True):
        assert torch.isfinite(a).all()
        assert not torch.equal(a, b)  # the optimizer step updated every table's rows


def test_local_backend_gives_per_device_costs_and_empty_device_pays_comm_only(comm_model):
    task = small_task(num_devices=3, memory_factor=3.0)
    placement = [0, 1, 0, 1, 0, 1]  # device 2 is empty
    m = measure_placement(task, placement, FAST, comm=comm_model)
    assert m.ok and m.error is None and len(m.per_device) == 3
    for d in m.per_device[:2]:
        assert math.isfinite(d.fwd_ms) and d.fwd_ms > 0 and d.bwd_ms > 0 and d.comm_ms > 0
    empty = m.per_device[2]
    assert empty.fwd_ms == 0 and empty.bwd_ms == 0 and empty.num_tables == 0
    dims = [
        sum(t.dim for t, d in zip(task.tables, placement, strict=True) if d == r) for r in (0, 1, 2)
    ]
    want = comm_model.device_comm_ms(dims, task.batch_size)  # the model handed in
    assert [d.comm_ms for d in m.per_device] == pytest.approx(want)
    assert empty.comm_ms > 0
    assert m.step_ms == pytest.approx(max(d.total_ms for d in m.per_device))
    assert m.reference_ms > 0 and m.normalised_step == pytest.approx(m.step_ms / m.reference_ms)


def test_single_device_has_no_communication():
    task = small_task(num_devices=1)
    m = measure_placement(task, [0] * 6, FAST)
    assert m.ok and m.per_device[0].comm_ms == 0 and m.per_device[0].fwd_ms > 0


def test_bad_placement_is_refused_before_any_kernel_runs(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("a kernel was built for a refused placement")

    monkeypatch.setattr(embedding_kernels.FusedKernel, "__init__", boom)
    task = small_task(num_devices=2)
    with pytest.raises(ValueError, match=r"device 0 is over its memory: its tables \['t0'"):
        measure_placement(task, [0] * 6, FAST)
    with pytest.raises(ValueError, match="out of range"):
        measure_placement(task, [0, 1, 2, 0, 1, 0], FAST)
    with pytest.raises(ValueError, match="backend must be one of"):
        measure_placement(task, [0, 1] * 3, FAST, backend="mpi")


def test_the_local_backend_over_several_devices_needs_an_all_to_all_model(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("a kernel was built without an all-to-all model to charge")

    monkeypatch.setattr(embedding_kernels.FusedKernel, "__init__", boom)
    with pytest.raises(ValueError, match="all-to-all of 2 devices from a model: pass comm="):
        measure_placement(small_task(num_devices=2), [0, 1] * 3, FAST)


def test_kernel_error_is_a_failed_measurement_not_a_crash(monkeypatch, comm_model):
    def oom(self, warmup, iters):
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(embedding_kernels.FusedKernel, "run_round", oom)
    m = measure_placement(small_task(), [0, 1] * 3, FAST, comm=comm_model)
    assert not m.ok and "out of memory" in m.error and math.isnan(m.step_ms)


def test_fbgemm_dim_rule_is_named():
    task = make_task([TableSpec(name="odd", rows=100, dim=6, pooling_factor=1.0)], 1, 16)
    with pytest.raises(ValueError, match=r"\['odd'\].*multiple of 4"):
        measure_placement(task, [0], FAST)


def test_random_placement_fits_memory():
    task = small_task(num_devices=3)
    for seed in range(5):
        placement = random_placement(task, seed)
        assert check_placement(task, placement) == placement


def test_comm_model_fit_recovers_known_constants():
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(40):
        d, mb = int(rng.integers(2, 5)), float(rng.uniform(0, 20))
        samples.append((d, mb, 0.3 + 0.2 * (d - 1) + 0.5 * mb))
    model = fit_comm_model(samples, "synthetic")
    assert model.latency_ms == pytest.approx(0.3, abs=1e-6)
    assert model.per_peer_ms == pytest.approx(0.2, abs=1e-6)
    assert model.ms_per_mb == pytest.approx(0.5, abs=1e-6)
    assert model.collective_ms(1, 10.0) == 0.0


def test_a2a_splits_follow_table_wise_sharding():
    send, recv = comm_mod.a2a_splits([16, 8, 0], batch_size=10, rank=0)
    assert send == [4 * 16, 3 * 16, 3 * 16]  # rank 0's pooled output, sliced by batch
    assert recv == [4 * 16, 4 * 8, 0]  # its batch slice of everyone's output
    flows = comm_mod.table_wise_flows([16, 8, 0], batch_size=10, elem_bytes=4)
    assert list(flows[0]) == [4 * e for e in send]  # bytes, the same splits
    assert list(flows[:, 0]) == [4 * e for e in recv]


@pytest.mark.slow
@pytest.mark.parametrize("num_devices", [2, pytest.param(4, marks=pytest.mark.another_size)])
def test_distributed_and_local_agree_on_compute(num_devices, comm_model):
    task = small_task(num_devices=num_devices, batch_size=512)
    placement = random_placement(task, 1)
    config = MeasureConfig(warmup=1, iters=3, rounds=2)
    local = measure_placement(task, placement, config, backend="local", comm=comm_model)
    dist_m = measure_placement(task, placement, config, backend="distributed")
    assert local.ok and dist_m.ok, (local.error, dist_m.error)
    assert dist_m.comm_source.startswith("measured: gloo")
    for m in (local, dist_m):
        assert len(m.per_device) == num_devices
        for d in m.per_device:
            assert math.isfinite(d.total_ms) and d.comm_ms > 0
            assert (d.fwd_ms > 0) == (d.num_tables > 0)

    # Compute in units of the reference kernel timed beside it: the machine is shared and
    # noisy, so the stated tolerance is a factor of 2.5 on the sum over devices, and a
    # disagreement is re-measured once (both backends again, interleaved; the minimum of
    # each backend's two figures is compared), as the benchmarks do with noisy timings.
    def relative_compute(m):
        return sum(d.compute_ms for d in m.per_device) / m.reference_ms

    lc, dc = relative_compute(local), relative_compute(dist_m)
    if not 1 / 2.5 < lc / dc < 2.5:
        again = measure_placement(task, placement, config, "local", comm_model)
        lc = min(lc, relative_compute(again))
        dc = min(dc, relative_compute(measure_placement(task, placement, config, "distributed")))
    assert 1 / 2.5 < lc / dc < 2.5, (lc, dc)


@pytest.mark.slow
def test_distributed_entry_point_under_torchrun(tmp_path):
    """``torchrun -m torchrec_dreamshard.cli.torchrun_measure TASK PLAN --db``: rank 0
    prints the measurement and appends it to the store."""
    import subprocess
    import sys
    from pathlib import Path

    from torchrec_dreamshard.data.tasks import placement_to_dict
    from torchrec_dreamshard.store import CostStore

    task = small_task(num_devices=2, memory_factor=3.0)
    placement = [0, 1, 0, 1, 0, 1]
    task.save(tmp_path / "task.json")
    plan = {"placement": placement_to_dict(task, placement)}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m"]
    cmd += ["torchrec_dreamshard.cli.torchrun_measure", str(tmp_path / "task.json")]
    cmd += [str(tmp_path / "plan.json"), "--db", str(tmp_path / "d.sqlite")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = json.loads(done.stdout[done.stdout.index("{") :])
    assert printed["backend"] == "distributed" and printed["step_ms"] > 0
    assert [d["num_tables"] for d in printed["per_device"]] == [3, 3]
    with CostStore(tmp_path / "d.sqlite") as store:
        (example,) = store.placement_examples()
    assert example.placement == placement and example.task.names == task.names
