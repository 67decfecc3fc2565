"""Task families: deterministic, disjoint train/test streams, the axes they promise."""

from __future__ import annotations

import numpy as np
import pytest

from torchrec_dreamshard.data import families as F
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.workloads import generate_batch


def test_draws_are_deterministic_and_splits_differ():
    a = F.draw_task("zipf", "test", 3)
    assert a.to_dict() == F.draw_task("zipf", "test", 3).to_dict()
    assert a.to_dict() != F.draw_task("zipf", "train", 3).to_dict()


def test_heldout_families_are_never_trained_on():
    assert set(F.HELDOUT_FAMILIES).isdisjoint(F.TRAIN_FAMILIES)
    assert set(F.HELDOUT_FAMILIES) | set(F.TRAIN_FAMILIES) == set(F.FAMILIES)
    assert len(F.HELDOUT_FAMILIES) >= 2


@pytest.mark.parametrize("name", sorted(F.FAMILIES))
def test_every_family_draws_a_valid_task_within_its_ranges(name):
    fam = F.family(name)
    task = F.draw_task(name, "test", 0)
    assert fam.tables[0] <= len(task.tables) <= fam.tables[1]
    assert task.num_devices in fam.devices and task.batch_size in fam.batch
    assert task.total_bytes <= sum(task.memory)
    if fam.access == "zipf":
        assert all(t.dim in fam.dims for t in task.tables)
        assert all(
            fam.pooling[0] - 1e-3 <= t.pooling_factor <= fam.pooling[1] + 1e-3 for t in task.tables
        )


def test_unequal_family_has_unequal_memory_and_tight_is_tight():
    task = F.draw_task("unequal", "test", 1)
    assert len(set(task.memory)) > 1
    tight = F.draw_task("tight", "test", 0)
    assert sum(tight.memory) <= 1.2 * tight.total_bytes * 1.001 + tight.num_devices


def test_zipf_skew_concentrates_accesses():
    rng = np.random.default_rng(0)
    flat = F.zipf_reuse_hist(100_000, 50_000, 0.0, rng)
    skewed = F.zipf_reuse_hist(100_000, 50_000, 1.3, rng)
    assert flat[0] > 0.7  # uniform: most accessed rows are read once
    mean = lambda h: float(np.dot(h, 2.0 ** np.arange(len(h))))  # noqa: E731
    assert mean(skewed) > 3 * mean(flat)


def test_bursty_bags_have_the_asked_variance():
    base = dict(name="t", rows=50_000, dim=8, pooling_factor=20.0)
    calm = generate_batch(TableSpec(**base), 4096, 0)[1].diff().numpy()
    bursty = generate_batch(TableSpec(**base, bag_length_cv=2.0), 4096, 0)[1].diff().numpy()
    assert calm.sum() == bursty.sum()  # same lookups
    assert calm.std() / calm.mean() < 0.4
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.25)


def test_unknown_family_and_bad_cv_are_named():
    with pytest.raises(ValueError, match="unknown task family 'nope'"):
        F.family("nope")
    with pytest.raises(ValueError, match="bag_length_cv"):
        TableSpec(name="t", rows=10, dim=4, pooling_factor=1.0, bag_length_cv=-1.0)
    spec = TableSpec(name="t", rows=10, dim=4, pooling_factor=1.0, bag_length_cv=1.5)
    assert TableSpec.from_dict(spec.to_dict()) == spec
