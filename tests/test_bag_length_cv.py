"""A table's bag-length cv (bursty bags) reaches ``DreamShardPlanner``'s specs: measured
from sample KJT batches (:func:`~torchrec_dreamshard.data.table_stats.gamma_poisson_cv`),
declared (``bag_length_cvs``, a task file's ``bag_length_cv``), validated, and part of the
planner's context and of the measurement caches' keys."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_dreamshard.cache.store_keys import table_signature
from torchrec_dreamshard.data.table_stats import gamma_poisson_cv, group_lengths
from torchrec_dreamshard.data.tables import MAX_BAG_LENGTH_CV, TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.data.workloads import generate_batch
from torchrec_dreamshard.planner.adapters.task_inputs import task_inputs
from torchrec_dreamshard.planner.adapters.torchrec_adapter import planner_reserved_topology
from torchrec_dreamshard.planner.stages.option_specs import OptionSpecs, bag_length_cvs, checked_cvs
from torchrec_dreamshard.planner.steps.verify_step import policy_choice
from torchrec_dreamshard.policy import DreamShard

BURSTY = np.array([1, 1, 1, 5] * 256)  # mean 2, std sqrt(3): excess over Poisson cv 0.5
WORLD = 2


def known_cv(lengths: np.ndarray) -> float:
    """The gamma share's cv of one global batch: (std / mean)^2 less 1 / mean."""
    mean, std = lengths.mean(), lengths.std()
    return math.sqrt((std / mean) ** 2 - 1 / mean)


# -- the estimator ------------------------------------------------------------------------


def test_cv_of_a_known_construction():
    assert known_cv(BURSTY) == pytest.approx(0.5)
    assert gamma_poisson_cv([BURSTY]) == pytest.approx(0.5)
    # two global batches weigh by samples: a group of lengths 3 (cv 0) pulls it down
    even = np.full(256, 3)  # var 0: its excess (0 - 3) / 3**2
    expected = math.sqrt(0.8 * 0.25 + 0.2 * (0 - 3) / 9)
    assert expected > 0.2 and gamma_poisson_cv([BURSTY, even]) == pytest.approx(expected)


def test_even_or_too_few_bags_have_no_cv():
    assert gamma_poisson_cv([np.full(512, 4)]) is None  # constant lengths
    assert gamma_poisson_cv([np.array([1, 1, 1, 5])]) is None  # 4 samples: within noise
    with pytest.raises(ValueError, match="no sample holds an id"):
        gamma_poisson_cv([np.zeros(8, dtype=np.int64)])


@pytest.mark.parametrize("pooling", [5.0, 40.0])
@pytest.mark.parametrize("cv", [None, 0.3, 1.4, 2.6])
def test_the_generators_cv_is_recovered(pooling, cv):
    spec = TableSpec(name="t", rows=100_000, dim=8, pooling_factor=pooling, bag_length_cv=cv)
    groups = [np.diff(generate_batch(spec, 2048, seed=s)[1].numpy()) for s in range(2)]
    measured = gamma_poisson_cv(groups)
    if cv is None:
        assert measured is None
    else:
        assert measured == pytest.approx(cv, rel=0.1)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=200).filter(lambda x: sum(x) > 0),
    st.integers(2, 5),
    st.randoms(use_true_random=False),
)
def test_cv_is_of_the_lengths_not_their_order_and_more_samples_keep_it(lengths, k, rnd):
    one = gamma_poisson_cv([np.array(lengths)])
    shuffled = list(lengths)
    rnd.shuffle(shuffled)
    other = gamma_poisson_cv([np.array(shuffled)])
    assert (other is None) == (one is None) and other == pytest.approx(one)
    if one is not None:
        assert 0 < one <= MAX_BAG_LENGTH_CV
        if one < MAX_BAG_LENGTH_CV:
            assert one == pytest.approx(known_cv(np.array(lengths)))
        # the same bags k times over: the same cv, known more surely
        assert gamma_poisson_cv([np.tile(lengths, k)]) == pytest.approx(one)
        assert gamma_poisson_cv([np.array(lengths)] * k) == pytest.approx(one)


# -- measured from sample KJT batches ----------------------------------------------------


def model() -> EmbeddingBagCollection:
    """t0 fed by f0; t1 by f1a and f1b together; t2 by f2, which no sample batch holds;
    t3 by f3, of even bags."""
    features = {"t0": ["f0"], "t1": ["f1a", "f1b"], "t2": ["f2"], "t3": ["f3"]}
    configs = [
        EmbeddingBagConfig(name=n, num_embeddings=64, embedding_dim=8, feature_names=f)
        for n, f in features.items()
    ]
    return EmbeddingBagCollection(tables=configs, device=torch.device("meta"))


def kjt(lengths: dict[str, np.ndarray]) -> KeyedJaggedTensor:
    flat = np.concatenate(list(lengths.values()))
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(lengths),
        values=torch.arange(int(flat.sum())) % 64,
        lengths=torch.from_numpy(flat).to(torch.int32),
    )


def sample_batches() -> list[KeyedJaggedTensor]:
    """Four per-rank batches (two global batches of two ranks): t0's bags [1, 1, 1, 5]
    over and over, t1's the same summed over its features (f1a's alone are burstier)."""
    half = BURSTY.size // 2
    batches = []
    for i in range(2 * WORLD):
        part = np.roll(BURSTY, i)[:half]
        f1a = part - 1
        batches.append(kjt({"f0": part, "f1a": f1a, "f1b": part - f1a, "f3": np.full(half, 3)}))
    return batches


def test_cvs_are_measured_per_table_over_its_features():
    measured = bag_length_cvs(model(), sample_batches(), WORLD)
    assert measured[".t0"] == pytest.approx(0.5, rel=0.02)
    assert measured[".t1"] == pytest.approx(measured[".t0"])
    assert ".t2" not in measured and measured[".t3"] is None  # not covered; even
    alone = gamma_poisson_cv([np.roll(BURSTY, 0) - 1])
    assert alone is not None and alone > 1.0  # f1a alone would have said another cv
    assert bag_length_cvs(model(), [], WORLD) == {}


def test_group_lengths_refuses_a_missing_feature():
    with pytest.raises(ValueError, match="'t2'.*f2"):
        group_lengths("t2", ["f2"], [sample_batches()[0].to_dict()])


def test_measured_cvs_win_and_uncovered_tables_keep_the_declared():
    declared = {".t0": 2.0, ".t2": 1.2, ".t3": 0.7}
    specs = OptionSpecs(sample_batches(), WORLD, declared_cvs=declared)
    assert specs.bag_length_cvs == declared  # before observing: what was declared
    specs.observe(model())
    cvs = specs.bag_length_cvs
    assert cvs[".t0"] == pytest.approx(0.5, rel=0.02) and cvs[".t2"] == 1.2
    assert ".t3" not in cvs  # measured even: no declared cv over the measurement


# -- declared -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf, MAX_BAG_LENGTH_CV + 1, 10**400, "1"])
def test_a_bad_declared_cv_is_refused_naming_its_table(bad):
    with pytest.raises(ValueError, match=r"bag_length_cvs\['\.t1'\]"):
        checked_cvs({".t0": 1.0, ".t1": bad})
    with pytest.raises(ValueError, match=r"\.t1"):
        OptionSpecs(declared_cvs={".t1": bad})
    with pytest.raises(ValueError, match="must map"):
        checked_cvs([1.0])
    assert checked_cvs({".t0": np.float32(1.5), ".t1": 0}) == {".t0": 1.5, ".t1": 0.0}


def bursty_task() -> Task:
    tables = [
        TableSpec(name=f"t{i}", rows=300 * (i + 1), dim=8, pooling_factor=2.0 + i) for i in range(5)
    ]
    tables[1] = TableSpec(name="t1", rows=600, dim=8, pooling_factor=3.0, bag_length_cv=1.8)
    tables[3] = TableSpec(name="t3", rows=1200, dim=8, pooling_factor=5.0, bag_length_cv=0.0)
    return Task(tables=tables, num_devices=WORLD, memory_bytes=10**7, batch_size=64)


def test_task_inputs_pass_the_declared_cvs():
    inputs = task_inputs(bursty_task())
    assert inputs.bag_length_cvs == {".t1": 1.8, ".t3": 0.0}
    assert inputs.planner_arguments()["bag_length_cvs"] == {".t1": 1.8, ".t3": 0.0}
    even = [dataclasses.replace(t, bag_length_cv=None) for t in bursty_task().tables]
    plain = dataclasses.replace(bursty_task(), tables=even)
    assert task_inputs(plain).bag_length_cvs == {}
    assert task_inputs(plain).planner_arguments()["bag_length_cvs"] == {}


def planned(**overrides):
    from torchrec_dreamshard.planner import DreamShardPlanner

    inputs = task_inputs(bursty_task())
    arguments = {**inputs.planner_arguments(), **overrides}
    planner = DreamShardPlanner(**arguments, agent=DreamShard.untrained(seed=0), measure=False)
    planner.plan(inputs.model, get_default_sharders())
    return planner


def test_a_bursty_task_plans_on_specs_with_its_cvs():
    planner = planned()
    specs = planner.table_specs.specs
    assert specs[".t1"].bag_length_cv == 1.8 and specs[".t3"].bag_length_cv == 0.0
    assert specs[".t0"].bag_length_cv is None
    # the task the policy placed (what the planner calibrates on and verifies) has them,
    # in the verification cache's key (the task's dict) too
    constraint = planner_reserved_topology(planner)
    batch = planner.plan_record.batch_size * constraint.world_size
    task = policy_choice(planner.best_options, constraint, planner.table_specs, batch).task
    assert [t.bag_length_cv for t in task.tables] == [None, 1.8, None, 0.0, None]
    assert task.to_dict()["tables"][1]["bag_length_cv"] == 1.8
    # the calibration store's kernel key sees the cv, not the name
    even = TableSpec(name="x", rows=600, dim=8, pooling_factor=3.0)
    assert table_signature(specs[".t1"]) != table_signature(even)
    assert table_signature(dataclasses.replace(even, name=".t1")) == table_signature(even)
    # and the planner's context: the same task planned on even bags is another context
    other = planned(bag_length_cvs=None)
    assert all(s.bag_length_cv is None for s in other.table_specs.specs.values())
    assert other.hash_planner_context_inputs_str() != planner.hash_planner_context_inputs_str()


def test_no_cv_leaves_the_context_key_as_it_was():
    specs = OptionSpecs(sample_batches(), WORLD, declared={".t2": (1.0,) + (0.0,) * 16})
    specs.observe(model())  # t0 and t1 measured bursty, t3 even
    assert set(specs.bag_length_cvs) == {".t0", ".t1"}
    key = specs.reuse_key()
    assert [k for k in key if k[0] == "bag_length_cv"] == [
        ("bag_length_cv", ".t0", specs.bag_length_cvs[".t0"]),
        ("bag_length_cv", ".t1", specs.bag_length_cvs[".t1"]),
    ]
    plain = OptionSpecs(declared={".t2": (1.0,) + (0.0,) * 16})
    plain.observe(model())
    assert plain.reuse_key() == [(".t2", (1.0,) + (0.0,) * 16)]  # as before cvs existed
