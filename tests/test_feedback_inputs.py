"""What a running job feeds its tables (``feedback/inputs.py``), and the job's level of the
kernels (``calibration.scale_compute``): the parts of a re-plan that learn what the user
did not declare."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_dreamshard.feedback.inputs import InputRecorder, ObservedInputs, pooling_sums

TABLES = [("sparse.a", "a", ["fa"]), ("sparse.b", "b", ["fb1", "fb2"]), ("sparse.c", "c", ["fc"])]


def kjt(lengths: dict[str, list[int]]) -> KeyedJaggedTensor:
    keys = list(lengths)
    flat = [n for k in keys for n in lengths[k]]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.arange(sum(flat)) % 7,
        lengths=torch.tensor(flat),
    )


class FakeSharded:
    """Stands for a sharded module: only its ``input_dist`` is touched."""

    def __init__(self) -> None:
        self.seen = 0

    def input_dist(self, ctx, features):
        self.seen += 1
        return features


def test_the_recorder_copies_a_modules_input_only_on_recorded_steps(monkeypatch):
    import torchrec_dreamshard.feedback.inputs as inputs

    module = FakeSharded()
    monkeypatch.setattr(inputs, "sharded_modules", lambda dmp: [module])
    recorder = InputRecorder(dmp=object())
    recorder.attach(object())  # a second attach does not wrap twice
    batch = kjt({"fa": [1, 3], "fb1": [2, 2], "fb2": [0, 1]})
    assert module.input_dist(None, batch) is batch  # not recording: passed through
    recorder.start()
    module.input_dist(None, batch)
    recorder.stop(keep=True)
    recorder.start()
    module.input_dist(None, batch)
    recorder.stop(keep=False)  # a dropped sample keeps nothing
    assert module.seen == 3 and len(recorder.steps) == 1
    assert pooling_sums(recorder.steps) == {"fa": (4, 2), "fb1": (4, 2), "fb2": (1, 2)}


def test_observed_pooling_replaces_the_declared_and_keeps_the_rest_of_the_constraints():
    given_constraints = {"a": ParameterConstraints(sharding_types=["table_wise"])}
    sums = {"fa": (400, 100), "fb1": (100, 100), "fb2": (50, 100)}  # fc: never fed
    inputs = ObservedInputs(TABLES, sums, given_constraints)
    by_fqn = {t.fqn: t for t in inputs.tables}
    assert set(by_fqn) == {"sparse.a", "sparse.b"}  # c's feature was not fed: defaults
    assert by_fqn["sparse.a"].declared == [1.0] and by_fqn["sparse.a"].observed == [4.0]
    assert inputs.pooling_by_fqn() == {"sparse.a": 4.0, "sparse.b": 1.5}
    constraints = inputs.constraints()
    assert constraints["a"].pooling_factors == [4.0]
    assert constraints["a"].sharding_types == ["table_wise"]  # the user's, kept
    assert constraints["b"].pooling_factors == [1.0, 0.5]
    assert "c" not in constraints
    assert [t.fqn for t in inputs.mispriced()] == ["sparse.a", "sparse.b"]
    exact = ObservedInputs(TABLES, sums, {"a": ParameterConstraints(pooling_factors=[4.1])})
    assert "sparse.a" not in [t.fqn for t in exact.mispriced()]  # within 10%


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(0, 6), min_size=1, max_size=5),  # one rank's lengths of fa
        min_size=1,
        max_size=3,
    ),
    st.integers(1, 3),
)
def test_recorded_steps_become_global_batches_rank_by_rank(lengths, steps):
    """``batches()`` is step-major, rank-minor (what ``sample_batches`` groups by world),
    each batch holding the rank's lengths as recorded; newest steps kept alike per rank."""
    ranks = []
    for r, ls in enumerate(lengths):
        recorded = []
        for s in range(steps + r):  # ranks hold unequal numbers: the newest are aligned
            batch = kjt({"fa": ls, "fb1": [1] * len(ls), "fb2": [s] * len(ls)})
            recorded.append({k: (jt.lengths(), jt.values()) for k, jt in batch.to_dict().items()})
        ranks.append(recorded)
    inputs = ObservedInputs(TABLES, pooling_sums(s for r in ranks for s in r), None, ranks)
    batches = inputs.batches()
    assert inputs.steps == steps and len(batches) == steps * len(lengths)
    for i, batch in enumerate(batches):
        step, rank = divmod(i, len(lengths))
        by_key = batch.to_dict()
        assert by_key["fa"].lengths().tolist() == lengths[rank]
        assert set(by_key["fb2"].lengths().tolist()) == {step + rank}  # the newest steps


def test_scaling_the_kernel_heads_scales_forward_and_backward_alone():
    from torchrec_dreamshard.calibration import scale_compute
    from torchrec_dreamshard.cost.cost_net import CostNet

    torch.manual_seed(0)
    net = CostNet(hidden=8, members=3)
    states = torch.rand(4, net.enc_dim)
    before = net.member_compute(states).detach()
    comm = net.comm_raw.detach().clone()
    scale_compute(net, (1.3, 0.7))
    after = net.member_compute(states).detach()
    assert after[..., 0] == pytest.approx(1.3 * before[..., 0], rel=1e-4)
    assert after[..., 1] == pytest.approx(0.7 * before[..., 1], rel=1e-4)
    assert torch.equal(net.comm_raw, comm)


def test_a_restarted_jobs_plan_takes_what_the_last_run_fed_its_tables(tmp_path):
    """What a re-plan keeps of the job's inputs (``remember_inputs``), the next plan of the
    same model takes over the declared pooling factors, says so, and hashes apart; a
    planner that does not learn (``calibrate=False``) plans as declared."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from torchrec_dreamshard.calibration import CalibrationConfig
    from torchrec_dreamshard.feedback.inputs import embedding_tables
    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.planner.adapters.torchrec_adapter import torchrec_topology
    from torchrec_dreamshard.store.fed_inputs_store import remember_inputs

    configs = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=16, num_embeddings=1000 * (i + 1), feature_names=[f"f{i}"]
        )
        for i in range(4)
    ]
    model = torch.nn.Module()
    model.ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    store = tmp_path / "store.sqlite"
    config = CalibrationConfig(budget_s=5.0, store=store, measure_missing=False, epochs=5)

    def planner(calibrate):
        return DreamShardPlanner(
            topology=torchrec_topology(2, "cpu"), batch_size=64, calibrate=calibrate, verify=0
        )

    def pooling(p):
        return {fqn: s.pooling_factor for fqn, s in p.table_specs.specs.items()}

    first = planner(config)
    first.plan(model, [EmbeddingBagCollectionSharder()])
    assert set(pooling(first).values()) == {1.0} and "inputs_from_job" not in first.adaptation
    sums = {"f0": (5000, 100), "f1": (300, 100)}  # the job fed t0 50 ids, t1 3; t2, t3 none
    fed = ObservedInputs(embedding_tables(model), sums, None)
    assert remember_inputs(store, model, fed.fed(), {"ebc.t0": [1.0] + [0.0] * 16}) == 2
    with pytest.raises(ValueError, match="not tables of the model"):
        remember_inputs(store, model, {"ebc.nope": [1.0]}, {})
    again = planner(config)
    again.plan(model, [EmbeddingBagCollectionSharder()])
    assert pooling(again) == {"ebc.t0": 50.0, "ebc.t1": 3.0, "ebc.t2": 1.0, "ebc.t3": 1.0}
    assert again.table_specs.specs["ebc.t0"].reuse_hist[0] == 1.0
    assert again.adaptation["inputs_from_job"] == ["ebc.t0", "ebc.t1"]
    assert again.hash_planner_context_inputs_str() != first.hash_planner_context_inputs_str()
    unlearning = planner(False)
    unlearning.plan(model, [EmbeddingBagCollectionSharder()])
    assert set(pooling(unlearning).values()) == {1.0}


def test_a_step_that_feeds_more_ids_than_are_kept_keeps_its_lengths_only(monkeypatch):
    """Past ``MAX_STEP_IDS`` a step's ids are not copied (a large job's batch would be
    gathered to every rank): its pooling factors still count, reuse is not measured."""
    import torchrec_dreamshard.feedback.inputs as inputs

    module = FakeSharded()
    monkeypatch.setattr(inputs, "sharded_modules", lambda dmp: [module])
    monkeypatch.setattr(inputs, "MAX_STEP_IDS", 5)
    recorder = InputRecorder(dmp=object())
    recorder.start()
    module.input_dist(None, kjt({"fa": [1, 3], "fb1": [2, 2], "fb2": [0, 1]}))
    recorder.stop(keep=True)
    step = recorder.steps[0]
    assert step["fa"][1] is not None and step["fb1"][1] is None  # 4 kept, then 8 > 5
    sums = pooling_sums(recorder.steps)
    assert sums == {"fa": (4, 2), "fb1": (4, 2), "fb2": (1, 2)}
    observed = ObservedInputs(TABLES, sums, None, [list(recorder.steps)])
    assert observed.batches() == [] and observed.pooling_by_fqn()["sparse.b"] == 2.5


def test_table_names_are_torchrecs_option_names_for_a_collection_at_the_top():
    """What the job fed a table, and what the store keeps, is found by TorchRec's
    ``ShardingOption.fqn``: ``".t0"`` for a collection that is the model itself."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from torchrec_dreamshard.data.table_stats import table_configs
    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.planner.adapters.torchrec_adapter import torchrec_topology

    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=f"t{i}", embedding_dim=8, num_embeddings=100, feature_names=[f"f{i}"]
            )
            for i in range(2)
        ],
        device=torch.device("meta"),
    )
    planner = DreamShardPlanner(
        topology=torchrec_topology(2, "cpu"), batch_size=32, calibrate=False, verify=0
    )
    planner.plan(ebc, [EmbeddingBagCollectionSharder()])
    assert {fqn for fqn, _ in table_configs(ebc)} == {o.fqn for o in planner.best_options}
