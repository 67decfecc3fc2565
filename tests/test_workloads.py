import numpy as np
import pytest
import torch

from torchrec_dreamshard.data.table_pool import synthetic_pool
from torchrec_dreamshard.data.table_stats import access_stats
from torchrec_dreamshard.data.tables import NUM_REUSE_BINS, TableSpec
from torchrec_dreamshard.data.workloads import (
    HIST_L1_TOLERANCE,
    POOLING_TOLERANCE,
    generate_batch,
    generate_fused_batch,
)


def test_batches_are_deterministic_in_the_seed():
    t = TableSpec(name="t", rows=5000, dim=8, pooling_factor=3.0)
    a = generate_batch(t, 256, seed=1)
    b = generate_batch(t, 256, seed=1)
    c = generate_batch(t, 256, seed=2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


INDICES = range(0, 856, 43)


def _hist_is_estimable(spec: TableSpec, batch: int) -> bool:
    """A batch touches enough distinct rows for its histogram to be estimated (>= 5000)
    and the table has room for them (twice as many rows)."""
    mids = np.array([1] + [2 ** (k - 1) * 1.5 for k in range(1, NUM_REUSE_BINS)])
    rows_needed = batch * spec.pooling_factor / float(np.sum(spec.hist(batch) * mids))
    return 5000 <= rows_needed < 0.5 * spec.rows


@pytest.mark.parametrize("index", INDICES)
def test_generated_batches_match_the_spec_pooling(index):
    spec = synthetic_pool(scale=1.0)[index]
    batch = 8192
    ids, offsets = generate_batch(spec, batch, seed=index)
    assert offsets.numel() == batch + 1 and offsets[-1] == ids.numel()
    assert int(ids.min()) >= 0 and int(ids.max()) < spec.rows
    pf, _ = access_stats(ids, offsets)
    assert pf == pytest.approx(spec.pooling_factor, rel=POOLING_TOLERANCE)


ESTIMABLE = [i for i in INDICES if _hist_is_estimable(synthetic_pool(scale=1.0)[i], 8192)]


def test_histogram_cases_exist():
    assert len(ESTIMABLE) >= 8  # the histogram test below checks real cases


@pytest.mark.parametrize("index", ESTIMABLE)
def test_generated_batches_match_the_spec_histogram(index):
    spec = synthetic_pool(scale=1.0)[index]
    ids, offsets = generate_batch(spec, 8192, seed=index)
    _, hist = access_stats(ids, offsets)
    l1 = float(np.abs(np.asarray(hist) - spec.hist(8192)).sum())
    assert l1 < HIST_L1_TOLERANCE, (spec, l1)


def test_small_table_uses_every_row_and_keeps_the_count():
    t = TableSpec(name="tiny", rows=10, dim=4, pooling_factor=20.0)
    ids, offsets = generate_batch(t, 100, seed=0)
    assert ids.numel() == 2000
    assert set(ids.tolist()) <= set(range(10))


def test_fused_batch_layout_is_table_major():
    tables = [
        TableSpec(name="a", rows=100, dim=4, pooling_factor=1.0),
        TableSpec(name="b", rows=50, dim=4, pooling_factor=5.0),
    ]
    ids, offsets = generate_fused_batch(tables, 64, seed=0)
    assert offsets.numel() == 2 * 64 + 1
    assert int(offsets[64]) == 64  # table a: 64 ids
    assert int(offsets[-1]) == ids.numel() == 64 + 320
    assert int(ids[64:].max()) < 50


def test_bad_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        generate_batch(TableSpec(name="a", rows=10, dim=4, pooling_factor=1.0), 0)
