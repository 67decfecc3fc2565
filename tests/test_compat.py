"""TorchRec's planner contract, run through ``DreamShardPlanner``.

The scenarios TorchRec's own planner tests walk through (plan ranks, no sharders, never
fit, fail then re-run, constraints reaching the plan, user proposers / enumerators /
partitioners / perf models / plan loaders, the plan-context hash and ``extract_plan``),
each with ``DreamShardPlanner`` in place of ``EmbeddingShardingPlanner``; where an outcome
is TorchRec's (an error type), TorchRec's planner is run on the same input beside it.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import warnings
from collections.abc import Iterator

import pytest
import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode, CacheAlgorithm
from torchrec.distributed import logger as torchrec_logger
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.logging_handlers import EventLoggingHandler
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.planners import extract_plan
from torchrec.distributed.planner.proposers import EmbeddingOffloadScaleupProposer, GreedyProposer
from torchrec.distributed.planner.stats import EmbeddingStats
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
from torchrec.distributed.planner.types import (
    ParameterConstraints,
    PerfModel,
    PlanLoader,
    PlannerError,
    PlannerErrorType,
    Proposer,
    ShardingOption,
    Topology,
)
from torchrec.distributed.types import CacheParams, ShardingPlan, ShardingType
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from torchrec_dreamshard.planner import DreamShardPlanner
from torchrec_dreamshard.planner.adapters.torchrec_adapter import (
    heuristical_reservation,
    planner_best_plan,
    torchrec_topology,
)
from torchrec_dreamshard.policy import DreamShard
from torchrec_dreamshard.torchrec_compat import planner_storage_reservation, planner_topology

META = torch.device("meta")
SHARDERS = [EmbeddingBagCollectionSharder()]
FQN = "ebc."


pytestmark = pytest.mark.usefixtures("quiet")


class Model(torch.nn.Module):
    def __init__(self, tables: list[EmbeddingBagConfig]) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=tables, device=META)


def tables(n: int = 6, rows: int = 1000, dim: int = 16) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=dim, num_embeddings=rows * (i + 1), feature_names=[f"f{i}"]
        )
        for i in range(n)
    ]


def topology(world: int = 2, ddr: int | None = None, device: str = "cpu") -> Topology:
    kw = {"ddr_cap": ddr} if ddr else {}
    if device == "cuda":
        kw = {"hbm_cap": ddr} if ddr else {}
    return Topology(world_size=world, compute_device=device, **kw)


def ours(agent, world: int = 2, **kw) -> DreamShardPlanner:
    topo = kw.pop("topology", None) or topology(world)
    return DreamShardPlanner(topo, kw.pop("batch_size", 64), agent=agent, debug=False, **kw)


def theirs(world: int = 2, **kw) -> EmbeddingShardingPlanner:
    topo = kw.pop("topology", None) or topology(world)
    return EmbeddingShardingPlanner(topo, kw.pop("batch_size", 64), debug=False, **kw)


def params(plan: ShardingPlan) -> dict:
    return plan.plan["ebc"]


# -- the constructor ----------------------------------------------------------------------


def test_constructor_takes_every_torchrec_argument_in_torchrec_order():
    torchrec = list(inspect.signature(EmbeddingShardingPlanner.__init__).parameters)
    mine = list(inspect.signature(DreamShardPlanner.__init__).parameters)
    assert mine[: len(torchrec)] == torchrec  # positional calls mean the same
    base = inspect.signature(EmbeddingShardingPlanner.__mro__[1].__init__).parameters
    assert set(base) <= set(mine)  # the base planner's storage-reservation percentage too


def test_components_of_the_wrong_type_are_named(agent):
    with pytest.raises(TypeError, match="proposer must be a TorchRec Proposer.*got str"):
        ours(agent, proposer=[GreedyProposer(), "greedy"])
    with pytest.raises(TypeError, match="enumerator must be a TorchRec Enumerator"):
        ours(agent, enumerator=object())


def test_storage_reservation_percentage_reserves_what_torchrec_s_does(agent):
    """Each device keeps what TorchRec's planner, given the same percentage, keeps; and a
    larger percentage keeps less."""
    model, topo = Model(tables(4)), topology(2, ddr=2**30, device="cuda")  # it reserves HBM
    kept = []
    for percentage in (0.15, 0.5):
        mine = ours(agent, topology=topo, heuristical_storage_reservation_percentage=percentage)
        reservation = HeuristicalStorageReservation(percentage=percentage)
        reference = theirs(topology=topo, storage_reservation=reservation)
        for planner in (mine, reference):
            planner.plan(model, SHARDERS)
        left = [
            [d.storage for d in planner_storage_reservation(p).last_reserved_topology.devices]
            for p in (mine, reference)
        ]
        assert left[0] == left[1], percentage
        kept.append(left[0][0].hbm)
    assert kept[1] < kept[0]


# -- plans --------------------------------------------------------------------------------


def test_plan_ranks_and_the_planner_s_attributes(agent):
    p = ours(agent, world=4)
    plan = p.plan(Model(tables(8)), SHARDERS)
    for name, ps in params(plan).items():
        assert ps.sharding_type == "table_wise" and 0 <= ps.ranks[0] < 4
        assert p.last_placement[FQN + name] == ps.ranks[0]
    assert proposals(p) >= 1
    best = {o.name: [s.rank for s in o.shards] for o in planner_best_plan(p)}
    assert best == {name: ps.ranks for name, ps in params(plan).items()}
    assert len({o.fqn for o in p._enumerator.last_stored_search_space}) == 8


def test_no_sharders_gives_an_empty_plan(agent):
    assert ours(agent).plan(Model(tables(3)), []) == ShardingPlan({})
    assert ours(agent).plan(torch.nn.Linear(2, 2), SHARDERS) == ShardingPlan({})


def test_never_fit_is_insufficient_storage_as_in_torchrec(agent):
    """6 tables of 2 MB to 12 MB on two devices of 4 MB: nothing can place them."""
    model, topo = Model(tables(6, rows=100_000, dim=5)), topology(2, ddr=4 * 2**20)
    errors = []
    for planner in (theirs(topology=topo), ours(agent, topology=topo)):
        with pytest.raises(PlannerError) as err:
            planner.plan(model, SHARDERS)
        errors.append(err.value.error_type)
    assert errors == [PlannerErrorType.INSUFFICIENT_STORAGE] * 2


class TableWiseOnlySharder(EmbeddingBagCollectionSharder):
    def sharding_types(self, compute_device_type: str) -> list[str]:
        return [ShardingType.TABLE_WISE.value]


def _one_big_table() -> tuple[Model, Topology]:
    """A 5.1 MB table and five small ones, on two devices of 4 MB: the table fits no
    device whole, the model fits the two together."""
    big = EmbeddingBagConfig(
        name="big", embedding_dim=128, num_embeddings=10_000, feature_names=["fb"]
    )
    return Model([*tables(5), big]), topology(2, ddr=4 * 2**20)


def test_fail_then_rerun_with_wider_sharders(agent):
    """TorchRec: table-wise only, a table that fits no device is STRICT_CONSTRAINTS; given
    sharders that allow column-wise, the same planner plans it."""
    model, topo = _one_big_table()
    cons = {"big": ParameterConstraints(min_partition=32)}
    for planner in (
        theirs(topology=topo, constraints=cons),
        ours(agent, topology=topo, constraints=cons),
    ):
        with pytest.raises(PlannerError) as err:
            planner.plan(model, [TableWiseOnlySharder()])
        assert err.value.error_type == PlannerErrorType.STRICT_CONSTRAINTS
        plan = planner.plan(model, SHARDERS)
        assert params(plan)["big"].sharding_type in ("column_wise", "table_column_wise")
    assert "ebc.big" in str(err.value)  # ours names the table


CONSTRAINT_FIELDS = {
    "cache_params": CacheParams(algorithm=CacheAlgorithm.LFU, load_factor=0.3),
    "enforce_hbm": True,
    "stochastic_rounding": False,
    "bounds_check_mode": BoundsCheckMode.WARNING,
    "output_dtype": DataType.FP16,
}


@pytest.mark.parametrize("field", sorted(CONSTRAINT_FIELDS))
def test_each_constraint_field_reaches_the_plan_as_in_torchrec(agent, field):
    """On a whole table, on a table split column-wise, and on a table TorchRec places."""
    value = CONSTRAINT_FIELDS[field]
    model, topo = _one_big_table()
    cons = {
        "t0": ParameterConstraints(**{field: value}),
        "big": ParameterConstraints(min_partition=32, **{field: value}),
        "t1": ParameterConstraints(sharding_types=["data_parallel"], **{field: value}),
    }
    plan = params(ours(agent, topology=topo, constraints=cons).plan(model, SHARDERS))
    reference = params(theirs(topology=topo, constraints=cons).plan(model, SHARDERS))
    assert plan["big"].sharding_type == "column_wise"  # split by DreamShard
    for name in cons:
        assert getattr(plan[name], field) == getattr(reference[name], field), name


def test_key_value_params_and_offloaded_caches_are_planned_by_torchrec(agent):
    """Kernels only TorchRec's machinery knows (UVM caches here, on a GPU topology) are
    planned beside the policy's tables, with their constraints, not refused."""
    from torchrec.distributed.types import KeyValueParams

    cache = CacheParams(algorithm=CacheAlgorithm.LRU, load_factor=0.2)
    kv = KeyValueParams(ssd_storage_directory="/tmp/ssd")
    cons = {
        "t0": ParameterConstraints(compute_kernels=["fused_uvm_caching"], cache_params=cache),
        "t1": ParameterConstraints(key_value_params=kv),
    }
    topo = topology(2, device="cuda")
    plan = params(ours(agent, topology=topo, constraints=cons).plan(Model(tables(4)), SHARDERS))
    assert plan["t0"].compute_kernel == "fused_uvm_caching" and plan["t0"].cache_params == cache
    assert plan["t1"].key_value_params == kv
    assert plan["t2"].sharding_type == "table_wise" and plan["t2"].compute_kernel == "fused"


# -- a user's components --------------------------------------------------------------------


class CacheProposer(Proposer):
    """Proposes every table as the search space has it, with new cache parameters."""

    CACHE = CacheParams(algorithm=CacheAlgorithm.LRU, load_factor=0.5, reserved_memory=1.0)

    def load(self, search_space, enumerator=None):
        self.first = {}
        for o in search_space:
            self.first.setdefault(o.fqn, o)
        self.done = False

    def propose(self):
        if self.done:
            return None
        self.done = True
        for o in self.first.values():
            o.cache_params = self.CACHE
        return list(self.first.values())

    def feedback(self, partitionable, plan=None, perf_rating=None, storage_constraint=None):
        pass


class Judge(PerfModel):
    """Rates proposals whose options carry ``CacheProposer.CACHE`` best, and counts."""

    def __init__(self):
        self.rated = 0

    def rate(self, plan: list[ShardingOption]) -> float:
        self.rated += 1
        return 1.0 if all(o.cache_params == CacheProposer.CACHE for o in plan) else 2.0


def test_user_proposals_join_ours_and_the_best_rated_wins(agent):
    p = ours(agent, proposer=GreedyProposer())
    p.plan(Model(tables(6)), SHARDERS)
    log = p.proposal_log
    assert set(log.proposals) == {"DreamShardProposer", "GreedyProposer#0"}
    assert log.proposals["GreedyProposer#0"] >= 1
    assert log.winner == min(log.best, key=log.best.get)
    assert p.perf_model.rate(planner_best_plan(p)) == pytest.approx(log.best[log.winner])
    assert any("Proposers" in row for row in p.cost_stats.last_table)


def test_a_user_proposer_s_choices_survive_when_it_wins(agent):
    judge = Judge()
    p = ours(agent, proposer=[CacheProposer()], performance_model=judge)
    plan = params(p.plan(Model(tables(4)), SHARDERS))
    assert judge.rated == 2 and p.proposal_log.winner == "CacheProposer#0"
    assert all(ps.cache_params == CacheProposer.CACHE for ps in plan.values())


def test_torchrec_s_offload_scaleup_proposer_is_accepted(agent):
    p = ours(agent, proposer=EmbeddingOffloadScaleupProposer())
    plan = p.plan(Model(tables(4)), SHARDERS)
    assert (
        len(params(plan)) == 4 and "EmbeddingOffloadScaleupProposer#0" in p.proposal_log.proposals
    )


def test_a_user_enumerator_is_the_search_space(agent):
    """TorchRec's full enumerator: the policy places the table-wise fused options, the
    table whose constraints forbid table-wise goes to TorchRec's machinery."""
    cons = {"t1": ParameterConstraints(sharding_types=["data_parallel"])}
    topo = topology(2)
    enumerator = EmbeddingEnumerator(topo, 64, cons)
    p = ours(agent, topology=topo, constraints=cons, enumerator=enumerator)
    plan = params(p.plan(Model(tables(5)), SHARDERS))
    assert p._enumerator is enumerator and enumerator.last_stored_search_space
    assert plan["t1"].sharding_type == "data_parallel"
    assert sorted(p.last_placement) == [FQN + t for t in ("t0", "t2", "t3", "t4")]


class CountingPartitioner(GreedyPerfPartitioner):
    calls = 0

    def partition(self, proposal, storage_constraint):
        CountingPartitioner.calls += 1
        return super().partition(proposal, storage_constraint)


def test_a_user_partitioner_places_what_carries_no_ranks(agent, monkeypatch):
    """The user's partitioner places the tables of DreamShard's proposal the policy does
    not (the data-parallel one, first) and every proposal of GreedyProposer's that
    TorchRec's planner partitions (it partitions each distinct set of options once: a
    proposal of the options DreamShard proposed is DreamShard's)."""
    from torchrec_dreamshard.planner.stages.partitioners import DreamShardPartitioner
    from torchrec_dreamshard.planner.stages.proposal import DreamShardProposal

    cons = {"t1": ParameterConstraints(sharding_types=["data_parallel"])}
    partitioner = CountingPartitioner()
    p = ours(agent, constraints=cons, partitioner=partitioner, proposer=GreedyProposer())
    seen = []
    partition = DreamShardPartitioner.partition

    def counted(self, proposal, storage_constraint):
        seen.append(type(proposal))
        return partition(self, proposal, storage_constraint)

    monkeypatch.setattr(DreamShardPartitioner, "partition", counted)
    CountingPartitioner.calls = 0
    p.plan(Model(tables(5)), SHARDERS)
    theirs = seen.count(list)
    assert seen.count(DreamShardProposal) == 1 and theirs >= 1
    assert CountingPartitioner.calls == 1 + theirs
    assert theirs >= p.proposal_log.proposals["GreedyProposer#0"] - 1


def placed(plan: list[ShardingOption]) -> list[tuple]:
    """What a partitioned proposal places: each option's table, type, kernel and ranks."""
    return sorted(
        (o.name, o.sharding_type, o.compute_kernel, tuple(s.rank for s in o.shards)) for o in plan
    )


class LatestWins(PerfModel):
    """Rates each proposal it is shown better than every one before it (so the last one
    rated wins, whatever the cost network thinks of it), and keeps what each placed."""

    def __init__(self) -> None:
        self.rated: list[list[tuple]] = []

    def rate(self, plan: list[ShardingOption]) -> float:
        self.rated.append(placed(plan))
        return -float(len(self.rated))


def test_a_user_perf_model_judges_the_proposals(agent):
    """The user's model rates every proposal that partitions (ours and GreedyProposer's),
    its ratings are the ones the proposers are fed back, and the plan it rated best is the
    plan, not the one the cost network would keep (ours, as the first of equals)."""
    model = LatestWins()
    p = ours(agent, performance_model=model, proposer=GreedyProposer())
    plan = params(p.plan(Model(tables(4)), SHARDERS))
    assert p._perf_model is model
    log = p.proposal_log
    # every proposal that partitioned, judged (TorchRec rates a repeated proposal once)
    assert 2 <= len(model.rated) <= sum(log.proposals.values())
    assert set(log.best.values()) <= {-float(i + 1) for i in range(len(model.rated))}
    assert log.best["DreamShardProposer"] == -1.0  # ours is proposed (and rated) first
    assert log.winner == "GreedyProposer#0" and log.best[log.winner] == -len(model.rated)
    assert placed(p.best_options) == model.rated[-1]  # the plan is the one rated best
    chosen = {name: (kind, list(ranks)) for name, kind, _, ranks in model.rated[-1]}
    assert {t: (ps.sharding_type, ps.ranks) for t, ps in plan.items()} == chosen
    assert p.last_prediction is not None  # the cost network still reports the plan


def test_stats_and_callbacks_are_torchrec_s(agent):
    seen = []

    def callback(plan):
        seen.append(len(plan))
        return plan

    logged = []

    class Counting(EmbeddingStats):
        def log(self, *args, **kwargs):
            logged.append(kwargs["best_plan"])

    p = ours(agent, callbacks=[callback], timeout_seconds=30, stats=[Counting()])
    p.plan(Model(tables(3)), SHARDERS)
    # the callbacks run once; every stats logger logs once, for the plan returned
    assert seen == [3] and len(logged) == 1 and logged[0] == p.best_options


# -- context hash, plan loading, extract_plan --------------------------------------------------


class Loader(PlanLoader):
    def __init__(self, options: dict[int, ShardingOption] | None, context: str | None):
        self.options, self.context = options, context

    def load(self):
        return self.options

    def plan_context_hash(self):
        return self.context

    def get_plan_id(self):
        return "test-plan"


def _stored(agent, **kw) -> tuple[ShardingPlan, Loader]:
    p = ours(agent, **kw)
    plan = p.plan(Model(tables(6)), SHARDERS)
    options = {o.storage_hash(): o for o in planner_best_plan(p)}
    return plan, Loader(options, p.hash_planner_context_inputs_str())


def test_hash_is_equal_for_equal_inputs_and_differs_for_ours(agent):
    def digest(**kw):
        p = ours(kw.pop("agent", agent), **kw)
        p.plan(Model(tables(4)), SHARDERS)
        return p.hash_planner_context_inputs_str(), p.hash_planner_context_inputs()

    same = digest()
    assert digest() == same
    others = [
        digest(agent=DreamShard.untrained(seed=1)),  # another checkpoint
        digest(mode="greedy"),
        digest(batch_size=128),
        digest(constraints={"t0": ParameterConstraints(pooling_factors=[3.0])}),
    ]
    assert all(o[0] != same[0] and o[1] != same[1] for o in others)


def proposals(planner: DreamShardPlanner) -> int:
    """Proposals the planner's proposers made in its last plan (0: a loaded plan)."""
    return sum(planner.proposal_log.proposals.values())


def test_hash_needs_a_plan_first_as_in_torchrec(agent):
    with pytest.raises(AssertionError, match="precomputed search space"):
        ours(agent).hash_planner_context_inputs_str()


def test_a_matching_plan_loader_reuses_the_plan(agent):
    plan, loader = _stored(agent, world=4)
    p = ours(agent, world=4, plan_loader=loader)
    assert p.plan(Model(tables(6)), SHARDERS) == plan
    assert proposals(p) == 0  # loaded, not planned


def test_a_split_plan_loads_too(agent):
    model, topo = _one_big_table()
    cons = {"big": ParameterConstraints(min_partition=32)}
    p = ours(agent, topology=topo, constraints=cons)
    plan = p.plan(model, SHARDERS)
    assert params(plan)["big"].sharding_type == "column_wise"
    loader = Loader(
        {o.storage_hash(): o for o in planner_best_plan(p)}, p.hash_planner_context_inputs_str()
    )
    again = ours(agent, topology=topo, constraints=cons, plan_loader=loader)
    assert again.plan(model, SHARDERS) == plan and proposals(again) == 0


def test_a_plan_from_another_checkpoint_is_never_reused(agent):
    _, loader = _stored(agent)
    p = ours(DreamShard.untrained(seed=1), plan_loader=loader)
    with pytest.raises(PlannerError) as err:
        p.plan(Model(tables(6)), SHARDERS)
    assert err.value.error_type == PlannerErrorType.PLANNER_INPUT_CONTEXT_MISMATCH


def test_an_empty_plan_loader_plans(agent):
    p = ours(agent, plan_loader=Loader(None, None))
    plan = p.plan(Model(tables(6)), SHARDERS)
    assert len(params(plan)) == 6 and proposals(p) >= 1


def test_extract_plan_from_the_stored_search_space(agent):
    plan, loader = _stored(agent)
    p = ours(agent)
    p.plan(Model(tables(6)), SHARDERS)
    extracted = extract_plan(p._enumerator.last_stored_search_space, loader.options)
    ranks = {o.name: [s.rank for s in o.shards] for o in extracted}
    assert ranks == {name: ps.ranks for name, ps in params(plan).items()}


# -- TorchRec's dry-run warnings ----------------------------------------------------------

DRY_RUN_WARNINGS = (
    "The topology was constructed directly",  # torchrec.distributed.planner.types
    "known issue with TorchRec's dense tensor size",  # ...planner.storage_reservations
)


class DenseModel(Model):
    """``Model`` with a dense part, all on the meta device."""

    def __init__(self, tables: list[EmbeddingBagConfig]) -> None:
        super().__init__(tables)
        self.dense = torch.nn.Linear(13, 32, device=META)


def dry_run_warnings(caplog, recorded) -> list[str]:
    """TorchRec's dry-run warnings among the records logged (TorchRec 1.8 logs both
    through ``logging``) and the ``warnings`` recorded."""
    texts = [r.getMessage() for r in caplog.records] + [str(w.message) for w in recorded]
    return [t for t in texts if any(s in t for s in DRY_RUN_WARNINGS)]


def test_our_topology_and_reservation_plan_a_meta_model_without_dry_run_warnings(agent, caplog):
    model = DenseModel(tables())
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        mine = [
            cls(
                torchrec_topology(2, "cpu"),
                64,
                debug=False,
                storage_reservation=heuristical_reservation(model, SHARDERS),
                **kw,
            )
            for cls, kw in ((DreamShardPlanner, {"agent": agent}), (EmbeddingShardingPlanner, {}))
        ]
        plans = [p.plan(model, SHARDERS) for p in mine]
        assert dry_run_warnings(caplog, recorded) == []
        assert not [w for w in recorded if "HeuristicalStorageReservation" in str(w.message)]
        # Built TorchRec's default way, both warnings are seen by the same check.
        default = EmbeddingShardingPlanner(Topology(world_size=2, compute_device="cpu"), 64)
        default_plan = default.plan(model, SHARDERS)
        assert len(dry_run_warnings(caplog, recorded)) == 2
    # Ours mean what TorchRec's default ones do: the same topology, dense storage (6 x the
    # Linear's fp32 bytes), reserved topology and plan.
    ours = planner_storage_reservation(mine[1])
    theirs = planner_storage_reservation(default)
    assert repr(planner_topology(mine[1])) == repr(planner_topology(default))
    assert ours._dense_storage == theirs._dense_storage
    assert ours._dense_storage.ddr == 6 * (13 * 32 + 32) * 4
    assert repr(ours.last_reserved_topology) == repr(theirs.last_reserved_topology)
    assert params(plans[1]) == params(default_plan)
    assert params(plans[0]).keys() == params(default_plan).keys()


@pytest.mark.parametrize(
    "kw",
    [
        {"world_size": 4, "compute_device": "cpu", "ddr_cap": 10**9},
        {"world_size": 16, "compute_device": "cuda", "local_world_size": 8, "hbm_cap": 2**34},
    ],
)
def test_torchrec_topology_is_the_topology_torchrec_builds_directly(kw):
    ours, theirs = torchrec_topology(**kw), Topology(**kw)
    assert repr(ours) == repr(theirs) and ours.devices == theirs.devices
    assert ours.intra_group_size == theirs.intra_group_size


# -- TorchRec's method log of plan(), kept as TorchRec keeps it ---------------------------


class Records(logging.Handler):
    """Keeps the records of ``plan`` it is handed."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict) and record.msg.get("func_name") == "plan":
            self.records.append(record)


@contextlib.contextmanager
def method_log_read() -> Iterator[Records]:
    """TorchRec's method logger with a handler that keeps its records of ``plan``."""
    records = Records()
    torchrec_logger.method_logger.addHandler(records)
    try:
        yield records
    finally:
        torchrec_logger.method_logger.removeHandler(records)


@pytest.mark.parametrize("fits", [True, False])
def test_plan_runs_torchrec_s_whole_plan_method_log_and_event_log_included(
    agent, monkeypatch, fits
):
    """Our ``plan`` is TorchRec's ``plan`` as decorated (no decorator rebuilt or
    skipped): its event log names ``EmbeddingShardingPlanner.plan`` and its method log
    records our planner's call, at INFO when it plans and at ERROR when it fails, as it
    records TorchRec's planner's."""
    events = []

    @contextlib.contextmanager
    def record_event(*args, **kwargs):
        events.append(kwargs["event_name"])
        yield

    monkeypatch.setattr(EventLoggingHandler, "log_event_context", record_event)
    model = Model(tables(6, rows=1000, dim=16) if fits else tables(6, rows=100_000, dim=5))
    topo = topology(2, ddr=None if fits else 4 * 2**20)
    levels = {}
    for name, planner in (("ours", ours(agent, topology=topo)), ("theirs", theirs(topology=topo))):
        with method_log_read() as log:
            try:
                planner.plan(model, SHARDERS)
            except PlannerError:
                assert not fits
        # (ours also runs TorchRec's planner as a rival candidate: its records are left out)
        own = f"<{type(planner).__module__}.{type(planner).__name__} object"
        levels[name] = [r.levelno for r in log.records if own in r.msg["input"]]
    assert levels["ours"] == levels["theirs"] == [logging.INFO if fits else logging.ERROR]
    assert "EmbeddingShardingPlanner.plan" in events
