import math

import numpy as np
import pytest
import torch

from torchrec_dreamshard.data.table_stats import (
    access_stats,
    spec_from_config,
    specs_from_kjt_batches,
)
from torchrec_dreamshard.data.tables import (
    FEATURE_DIM,
    NUM_REUSE_BINS,
    TableSpec,
    reuse_bin,
    table_features,
    uniform_reuse_hist,
)


def spec(**kw):
    base = dict(name="t0", rows=1000, dim=16, pooling_factor=4.0)
    base.update(kw)
    return TableSpec(**base)


def one_hot(k):
    h = [0.0] * NUM_REUSE_BINS
    h[k] = 1.0
    return tuple(h)


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(rows=0), "rows"),
        (dict(rows=-5), "rows"),
        (dict(rows=2.5), "rows"),
        (dict(dim=0), "dim"),
        (dict(dim=True), "dim"),
        (dict(pooling_factor=0.0), "pooling_factor"),
        (dict(pooling_factor=float("nan")), "pooling_factor"),
        (dict(pooling_factor=float("inf")), "pooling_factor"),
        (dict(reuse_hist=(0.5,) * 2), "reuse_hist"),
        (dict(reuse_hist=(0.1,) * NUM_REUSE_BINS), "reuse_hist"),
        (dict(reuse_hist=(-0.1, 1.1) + (0.0,) * 15), "reuse_hist"),
        (dict(bytes_per_element=3), "bytes_per_element"),
    ],
)
def test_bad_specs_name_table_and_field(kw, field):
    with pytest.raises(ValueError) as err:
        spec(name="user_table", **kw)
    assert "user_table" in str(err.value)
    assert field in str(err.value)


def test_spec_round_trip_and_size():
    t = spec(reuse_hist=one_hot(3), bytes_per_element=2)
    assert t.size_bytes == 1000 * 16 * 2
    assert TableSpec.from_dict(t.to_dict()) == t


def test_from_dict_rejects_unknown_and_missing_fields():
    with pytest.raises(ValueError, match="unknown fields"):
        TableSpec.from_dict({"name": "a", "rows": 1, "dim": 1, "pooling_factor": 1, "x": 1})
    with pytest.raises(ValueError, match="missing fields"):
        TableSpec.from_dict({"name": "a", "rows": 1})


def test_reuse_bins_follow_powers_of_two():
    counts = np.array([1, 2, 3, 4, 5, 8, 9, 32768, 32769, 10**6])
    assert reuse_bin(counts).tolist() == [0, 1, 2, 2, 3, 3, 4, 15, 16, 16]


def test_access_stats_from_ids_and_offsets():
    # 4 samples; row 7 used 3 times, row 1 twice, rows 2 and 3 once.
    ids = torch.tensor([7, 1, 7, 2, 7, 1, 3])
    offsets = torch.tensor([0, 2, 3, 5, 7])
    pf, hist = access_stats(ids, offsets)
    assert pf == pytest.approx(7 / 4)
    assert hist[0] == pytest.approx(0.5)  # rows 2, 3
    assert hist[1] == pytest.approx(0.25)  # row 1 (count 2)
    assert hist[2] == pytest.approx(0.25)  # row 7 (count 3)


def test_access_stats_rejects_bad_offsets():
    with pytest.raises(ValueError, match="offsets"):
        access_stats(torch.tensor([1, 2]), torch.tensor([0, 3]))


def test_features_do_not_depend_on_other_tables():
    a, b, c = spec(name="a"), spec(name="b", rows=10**6, dim=128), spec(name="c", dim=4)
    alone = table_features([a])
    with_others = table_features([b, a, c])
    assert alone.shape == (1, FEATURE_DIM)
    np.testing.assert_array_equal(alone[0], with_others[1])
    assert np.all(np.isfinite(with_others))
    assert with_others[0, 0] > with_others[1, 0]  # bigger dim, bigger feature


def test_uniform_hist_is_a_distribution_and_shifts_with_load():
    light = uniform_reuse_hist(10**6, 1000)
    heavy = uniform_reuse_hist(100, 10**5)
    assert light.sum() == pytest.approx(1.0) and heavy.sum() == pytest.approx(1.0)
    assert light[0] > 0.99
    assert heavy.argmax() == math.ceil(math.log2(1000))


def test_spec_from_config_uses_constraint_pooling():
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    cfg = EmbeddingBagConfig(num_embeddings=500, embedding_dim=32, name="t", feature_names=["f"])
    s = spec_from_config(cfg, ParameterConstraints(pooling_factors=[3.0, 2.0]))
    assert (s.rows, s.dim, s.pooling_factor) == (500, 32, 5.0)
    assert spec_from_config(cfg).pooling_factor == 1.0


def test_specs_from_kjt_see_multi_feature_tables_like_the_kernel():
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    configs = [
        EmbeddingBagConfig(num_embeddings=100, embedding_dim=8, name="a", feature_names=["f1"]),
        EmbeddingBagConfig(
            num_embeddings=100, embedding_dim=8, name="b", feature_names=["f2", "f3"]
        ),
    ]
    # batch of 2: f1 lengths [1, 1], f2 lengths [2, 0], f3 lengths [1, 1]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f1", "f2", "f3"],
        values=torch.tensor([5, 5, 1, 2, 1, 9]),
        lengths=torch.tensor([1, 1, 2, 0, 1, 1]),
    )
    a, b = specs_from_kjt_batches(configs, [kjt, kjt])
    assert a.pooling_factor == pytest.approx(1.0)
    assert a.reuse_hist[1] == pytest.approx(1.0)  # row 5 twice
    assert b.pooling_factor == pytest.approx(2.0)  # 4 ids over 2 samples
    # b's ids: 1, 2, 1, 9 -> row 1 twice, rows 2 and 9 once
    assert b.reuse_hist[0] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="not in the batch"):
        specs_from_kjt_batches(
            [EmbeddingBagConfig(num_embeddings=5, embedding_dim=4, name="c", feature_names=["z"])],
            [kjt],
        )
