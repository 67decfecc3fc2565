"""Tests of the SQLite cost dataset (torchrec_dreamshard.store.cost_store)."""

from __future__ import annotations

import json
import math

import pytest

from torchrec_dreamshard.data.sampler import make_task
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.measure import (
    DeviceCost,
    MeasureConfig,
    PlacementMeasurement,
    hardware_fingerprint,
)
from torchrec_dreamshard.store import CostStore


def task():
    tables = [TableSpec(name=f"t{i}", rows=1000, dim=8, pooling_factor=2.0) for i in range(4)]
    return make_task(tables, 2, 128, memory_factor=3.0)


def measurement(scale: float = 1.0, reference: float = 2.0) -> PlacementMeasurement:
    per_device = [
        DeviceCost(1.0 * scale, 2.0 * scale, 0.5 * scale, 0.01, 3),
        DeviceCost(0.5 * scale, 1.0 * scale, 0.5 * scale, 0.02, 1),
    ]
    return PlacementMeasurement(
        per_device=per_device,
        step_ms=max(d.total_ms for d in per_device),
        spread=0.03,
        reference_ms=reference,
    )


def test_append_and_read_back_examples(tmp_path):
    t, config = task(), MeasureConfig()
    with CostStore(tmp_path / "c.sqlite") as store:
        rid = store.append(t, [0, 0, 0, 1], measurement(), config)
        assert rid == 1 and store.count() == 1
        (ex,) = store.placement_examples()
        assert ex.placement == [0, 0, 0, 1] and ex.step_ms == pytest.approx(3.5)
        assert ex.task.to_dict() == t.to_dict()
        devs = store.device_examples()
        assert [len(d.tables) for d in devs] == [3, 1]
        assert devs[0].tables[0] == t.tables[0] and devs[0].batch_size == 128
        assert (devs[1].fwd_ms, devs[1].bwd_ms, devs[1].comm_ms) == (0.5, 1.0, 0.5)
        assert devs[0].num_devices == 2


def test_rows_persist_across_connections_and_failures_are_kept_apart(tmp_path):
    path, t, config = tmp_path / "c.sqlite", task(), MeasureConfig()
    with CostStore(path) as store:
        store.append(t, [0, 1, 0, 1], measurement(), config, job="c:0")
        store.append(t, [0, 1, 0, 1], PlacementMeasurement.failed("OOM", "local"), config, "c:1")
    with CostStore(path) as store:
        assert store.count() == 2 and store.count(ok=True) == 1 and store.count(ok=False) == 1
        assert store.done_jobs("c:") == {"c:0", "c:1"} and store.done_jobs("x:") == set()
        assert len(store.placement_examples()) == 1  # the failed row is not an example
        with pytest.raises(ValueError, match="already holds job"):  # a job is recorded once
            store.append(t, [0, 1, 0, 1], measurement(), config, job="c:0")


def test_different_workloads_or_hardware_are_never_mixed_silently(tmp_path):
    t = task()
    with CostStore(tmp_path / "c.sqlite") as store:
        store.append(t, [0, 1, 0, 1], measurement(), MeasureConfig())
        store.append(t, [0, 1, 0, 1], measurement(2.0), MeasureConfig(optimizer="sgd"))
        with pytest.raises(ValueError, match="2 hardware/workload groups") as err:
            store.device_examples()
        assert "b128-sgd-fp32-cpu" in str(err.value)
        assert "b128-rowwise_adagrad-fp32-cpu" in str(err.value)
        sgd = store.placement_examples(workload="b128-sgd-fp32-cpu")
        assert len(sgd) == 1 and sgd[0].step_ms == pytest.approx(7.0)
        # another machine's rows: same workload, other fingerprint
        other = dict(hardware_fingerprint(MeasureConfig()), device_name="Other CPU")
        store._fingerprints.clear()
        store._fingerprints[
            ("cpu", "local", json.dumps(MeasureConfig().protocol(), sort_keys=True))
        ] = other
        store.append(t, [0, 1, 0, 1], measurement(), MeasureConfig())
        with pytest.raises(ValueError, match="Other CPU"):
            store.placement_examples(workload="b128-rowwise_adagrad-fp32-cpu")
        mine = hardware_fingerprint(MeasureConfig())
        assert len(store.placement_examples(mine, "b128-rowwise_adagrad-fp32-cpu")) == 1
        assert {g["ok_rows"] for g in store.groups()} == {1}


def test_normalised_examples_factor_out_machine_speed(tmp_path):
    t, config = task(), MeasureConfig()
    with CostStore(tmp_path / "c.sqlite") as store:
        # the same placement measured while the machine ran at full and at half speed
        store.append(t, [0, 1, 0, 1], measurement(1.0, reference=2.0), config)
        store.append(t, [0, 1, 0, 1], measurement(2.0, reference=4.0), config)
        raw = [e.step_ms for e in store.placement_examples()]
        norm = [e.step_ms for e in store.placement_examples(normalise=True)]
        assert raw[1] == pytest.approx(2 * raw[0])
        assert norm[0] == pytest.approx(norm[1])


def test_nan_figures_are_stored_as_null(tmp_path):
    with CostStore(tmp_path / "c.sqlite") as store:
        failed = PlacementMeasurement.failed("x", "local")
        assert math.isnan(failed.step_ms)  # NaN goes in...
        store.append(task(), [0, 1, 0, 1], failed, MeasureConfig())
        row = store._conn.execute("SELECT step_ms, error, ok FROM measurements").fetchone()
    assert row == (None, "x", 0)  # ...and SQLite holds NULL, not a NaN REAL


def test_bad_paths_are_named(tmp_path):
    with pytest.raises(ValueError, match="folder does not exist"):
        CostStore(tmp_path / "missing" / "c.sqlite")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(ValueError, match="not a usable SQLite cost store"):
        CostStore(junk)


def test_a_table_beside_the_measurements_goes_through_the_stores_connection(tmp_path):
    """Another part's table lives in the store's file through the store's own connection
    and error handling; reopening finds its rows, a bad statement is a named ValueError."""
    path = tmp_path / "c.sqlite"
    with CostStore(path) as store:
        assert not store.has_table("extra")
        store.add_table("CREATE TABLE IF NOT EXISTS extra (k TEXT PRIMARY KEY, v REAL);")
        store.write_rows(
            "INSERT OR REPLACE INTO extra (k, v) VALUES (?,?)", [("a", 1.0), ("b", 2.0)]
        )
        store.append(task(), [0, 1, 0, 1], measurement(), MeasureConfig())
    with CostStore(path) as store:
        assert store.has_table("extra") and store.count() == 1
        assert store.read_rows("SELECT k, v FROM extra WHERE v > ? ORDER BY k", (1.5,)) == [
            ("b", 2.0)
        ]
        with pytest.raises(ValueError, match="not a usable SQLite cost store.*no such table"):
            store.read_rows("SELECT * FROM missing")


def test_reference_scales_bring_rows_to_the_typical_speed():
    from torchrec_dreamshard.measure.summary import reference_scales

    assert reference_scales([1.0, 2.0, 4.0]) == [2.0, 1.0, 0.5]
    assert reference_scales([2.0, float("nan"), None]) == [1.0, 1.0, 1.0]
    assert reference_scales([]) == []
