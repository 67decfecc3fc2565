"""DreamShardPlanner on meta-device models: valid plans, memory caps, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.types import (
    ParameterConstraints,
    PlannerError,
    PlannerErrorType,
    Shard,
    ShardingOption,
    Storage,
    Topology,
)
from torchrec.distributed.types import ParameterSharding, ShardingPlan
from torchrec.models.dlrm import DLRM
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_dreamshard.planner import DreamShardPartitioner, DreamShardPlanner
from torchrec_dreamshard.planner.adapters.torchrec_adapter import (
    planner_best_plan,
    planner_reserved_topology,
)
from torchrec_dreamshard.policy import DreamShard

META = torch.device("meta")
SHARDERS = [EmbeddingBagCollectionSharder()]


pytestmark = pytest.mark.usefixtures("quiet")


def configs(n: int, rows: int = 1000, dim: int = 16, prefix: str = "t") -> list:
    return [
        EmbeddingBagConfig(
            name=f"{prefix}{i}",
            embedding_dim=dim,
            num_embeddings=rows * (i + 1),
            feature_names=[f"{prefix}f{i}"],
        )
        for i in range(n)
    ]


def dlrm(tables: list, device: torch.device = META) -> DLRM:
    ebc = EmbeddingBagCollection(tables=tables, device=device)
    return DLRM(
        embedding_bag_collection=ebc,
        dense_in_features=4,
        dense_arch_layer_sizes=[8, tables[0].embedding_dim],
        over_arch_layer_sizes=[8, 1],
        dense_device=device,
    )


def planner(agent: DreamShard, world: int = 4, **kw) -> DreamShardPlanner:
    topo = kw.pop("topology", None) or Topology(world_size=world, compute_device="cpu")
    return DreamShardPlanner(topology=topo, batch_size=kw.pop("batch_size", 64), agent=agent, **kw)


def rank_storage(p: DreamShardPlanner) -> list[int]:
    used = [0] * planner_reserved_topology(p).world_size
    for option in planner_best_plan(p):
        for shard in option.shards:
            used[shard.rank] += shard.storage.ddr
    return used


def test_plan_is_a_valid_sharding_plan(agent):
    model = dlrm(configs(10))
    p = planner(agent, world=4)
    plan = p.plan(model, SHARDERS)
    assert isinstance(plan, ShardingPlan)
    module_plan = plan.plan["sparse_arch.embedding_bag_collection"]
    assert sorted(module_plan) == sorted(f"t{i}" for i in range(10))
    for name, ps in module_plan.items():
        assert isinstance(ps, ParameterSharding)
        assert ps.sharding_type == "table_wise" and ps.compute_kernel == "fused"
        assert len(ps.ranks) == 1 and 0 <= ps.ranks[0] < 4
        fqn = f"sparse_arch.embedding_bag_collection.{name}"
        assert ps.ranks[0] == p.last_placement[fqn]
        shard = ps.sharding_spec.shards[0]
        assert shard.placement.rank() == ps.ranks[0]
    pred = p.last_prediction
    assert pred is not None and len(pred.fwd_ms) == 4 and pred.step_ms > 0
    assert any("predicted per-rank" in row for row in p.cost_stats.last_table)
    # the stats say how planning adapted to this machine (the tests pin the reference
    # kernel as unmeasured, so the default plans with the checkpoint as it is)
    assert any(
        "This machine: the reference kernel was not measured" in row
        for row in p.cost_stats.last_table
    )


def test_the_plan_record_is_a_value_and_its_factory_shares_no_user_component(agent):
    """``plan_record`` carries the plan and what it was planned from; the factory in it
    builds a planner of the same arguments with the given agent and deep copies of the
    user's components: planning with it leaves the user's proposer as it was."""
    from torchrec.distributed.planner.proposers import GreedyProposer

    from torchrec_dreamshard.planner.plans.plan_record import PlanRecord

    with pytest.raises(ValueError, match="call collective_plan first"):
        _ = planner(agent).plan_record
    mine = GreedyProposer()
    constraints = {"t0": ParameterConstraints(sharding_types=["table_wise"])}
    p = planner(agent, world=2, proposer=mine, constraints=constraints, calibrate=False)
    plan = p.plan(dlrm(configs(4)), SHARDERS)
    record = p.plan_record
    assert isinstance(record, PlanRecord) and record.plan is plan
    assert record.prediction is p.last_prediction and record.batch_size == 64
    assert record.global_batch == 128 and record.topology.world_size == 2
    assert record.constraints is constraints and record.prior_agent is record.agent is agent
    assert {o.name for o in record.best_options} == {f"t{i}" for i in range(4)}
    with pytest.raises(ValueError, match="rank 0 keeps it"):  # plan(), not collective_plan
        _ = record.planned_inputs
    with pytest.raises(AttributeError):  # frozen
        record.plan = None
    assert len(mine._sharding_options_by_fqn) == 4  # the user's proposer saw 4 tables
    fresh = record.replanner(agent, seed=1)
    assert isinstance(fresh, DreamShardPlanner) and fresh is not p
    fresh.plan(dlrm(configs(6)), SHARDERS)  # its copy of the proposer sees 6
    assert {o.name for o in fresh.best_options} == {f"t{i}" for i in range(6)}
    assert len(mine._sharding_options_by_fqn) == 4  # the user's is as the user's plan left it
    assert fresh.options.seed == 1 and fresh.options.verify == 0


def test_several_collections_nested_anywhere(agent):
    class Towers(nn.Module):
        def __init__(self):
            super().__init__()
            self.user = nn.ModuleDict({"ebc": EmbeddingBagCollection(configs(3), device=META)})
            self.item = nn.Sequential(EmbeddingBagCollection(configs(4), device=META))
            self.top = nn.Linear(4, 1, device=META)

    plan = planner(agent, world=2).plan(Towers(), SHARDERS)
    assert sorted(plan.plan) == ["item.0", "user.ebc"]
    assert len(plan.plan["user.ebc"]) == 3 and len(plan.plan["item.0"]) == 4


def test_memory_caps_hold_after_storage_reservation(agent):
    tables = configs(12, rows=20_000, dim=32)  # 2.56 MB .. 30.7 MB of weights
    total = sum(t.num_embeddings * t.embedding_dim * 4 for t in tables)
    topo = Topology(world_size=4, compute_device="cpu", ddr_cap=int(total / 4 * 1.6))
    p = planner(agent, topology=topo)
    p.plan(dlrm(tables), SHARDERS)
    caps = [d.storage.ddr for d in planner_reserved_topology(p).devices]
    used = rank_storage(p)
    assert all(u <= c for u, c in zip(used, caps, strict=True)), (used, caps)
    assert sum(1 for u in used if u > 0) >= 3  # it had to spread the tables


def _huge_model(agent, constraints):
    tables = configs(4, rows=1000, dim=64) + [
        EmbeddingBagConfig(
            name="huge", embedding_dim=64, num_embeddings=400_000, feature_names=["fh"]
        )
    ]
    topo = Topology(world_size=4, compute_device="cpu", ddr_cap=80 * 2**20)  # 102 MB table
    p = planner(agent, topology=topo, constraints=constraints)
    plan = p.plan(dlrm(tables), SHARDERS)
    return p, plan.plan["sparse_arch.embedding_bag_collection"]


def test_table_that_fits_no_device_is_split_column_wise(agent):
    cons = {"huge": ParameterConstraints(min_partition=16)}  # column-wise shards of >= 16
    p, module_plan = _huge_model(agent, cons)
    huge = module_plan["huge"]
    assert huge.sharding_type == "column_wise" and huge.compute_kernel == "fused"
    fqn = "sparse_arch.embedding_bag_collection.huge"
    shards = p.last_shards[fqn]
    assert huge.ranks == [s["device"] for s in shards] and len(set(huge.ranks)) == len(shards)
    cols = [s["columns"] for s in shards]
    assert cols[0][0] == 0 and cols[-1][1] == 64 and all(b - a >= 16 for a, b in cols)
    assert all(x[1] == y[0] for x, y in zip(cols, cols[1:], strict=False))
    spec = huge.sharding_spec.shards
    assert [[m.shard_offsets[1], m.shard_offsets[1] + m.shard_sizes[1]] for m in spec] == cols
    assert fqn not in p.last_placement and len(p.last_placement) == 4
    caps = [d.storage.ddr for d in planner_reserved_topology(p).devices]
    assert all(u <= c for u, c in zip(rank_storage(p), caps, strict=True))
    assert p.last_prediction.tables and sum(p.last_prediction.tables) == 4 + len(shards)


def test_table_too_big_with_only_table_wise_is_a_clear_error(agent):
    tables = configs(2) + [
        EmbeddingBagConfig(
            name="huge", embedding_dim=16, num_embeddings=1_600_000, feature_names=["fh"]
        )
    ]
    topo = Topology(world_size=2, compute_device="cpu", ddr_cap=80 * 2**20)
    cons = {"huge": ParameterConstraints(sharding_types=["table_wise"])}
    with pytest.raises(
        PlannerError, match=r"huge \(\d+ bytes\)'\] fit on no device.*no other"
    ) as err:
        planner(agent, topology=topo, constraints=cons).plan(dlrm(tables), SHARDERS)
    # the devices hold the model in all: TorchRec calls that strict constraints
    assert err.value.error_type == PlannerErrorType.STRICT_CONSTRAINTS


def test_constraints_forbidding_table_wise_go_to_torchrec(agent):
    cons = {"t1": ParameterConstraints(sharding_types=["column_wise"])}
    p = planner(agent, world=2, constraints=cons)
    plan = p.plan(dlrm(configs(5)), SHARDERS)
    module_plan = plan.plan["sparse_arch.embedding_bag_collection"]
    assert module_plan["t1"].sharding_type == "column_wise"
    assert all(module_plan[f"t{i}"].sharding_type == "table_wise" for i in (0, 2, 3, 4))
    # TorchRec's column-wise fused option: the cost network rates each shard as a table
    shards = p.last_shards["sparse_arch.embedding_bag_collection.t1"]
    assert [s["device"] for s in shards] == module_plan["t1"].ranks
    assert sum(p.last_prediction.tables) == 4 + len(shards)


def test_the_proposer_proposes_and_the_partitioner_places(agent):
    """Each step where TorchRec has it: the proposer proposes one option per table and
    places nothing (a table the policy may not place keeps TorchRec's option); the
    partitioner places the proposal, TorchRec's partitioner the other table and the policy
    its own, and raises its own error when they do not fit."""
    import copy

    from torchrec_dreamshard.planner.stages.enumerators import copy_options
    from torchrec_dreamshard.planner.stages.proposal import DreamShardProposal

    cons = {"t1": ParameterConstraints(sharding_types=["data_parallel"])}
    p = planner(agent, world=2, constraints=cons)
    p.plan(dlrm(configs(4)), SHARDERS)
    p.proposer.load(copy_options(p._enumerator.last_stored_search_space), p._enumerator)
    proposal = p.proposer.propose()
    assert isinstance(proposal, DreamShardProposal) and p.proposer.propose() is None
    fqn = "sparse_arch.embedding_bag_collection.t{}".format
    assert [o.fqn for o in proposal.other_options()] == [fqn(1)]
    assert sorted(proposal.policy) == [fqn(i) for i in (0, 2, 3)]
    assert all(s.rank is None for o in proposal for s in o.shards)
    constraint = planner_reserved_topology(p)
    plan = p.partitioner.partition(proposal, constraint)
    assert {o.fqn: [s.rank for s in o.shards] for o in plan} == {
        o.fqn: [s.rank for s in o.shards] for o in planner_best_plan(p)
    }
    for option in proposal:
        for shard in option.shards:
            shard.rank = None
    small = copy.deepcopy(constraint)
    for device in small.devices:
        device.storage.ddr = 100_000  # bytes: less than the tables need in all
    with pytest.raises(PlannerError):
        p.partitioner.partition(proposal, small)


def test_model_too_big_for_all_devices_is_a_clear_error(agent):
    tables = configs(6, rows=50_000, dim=64)  # 12.8 .. 76.8 MB each, 269 MB in all
    topo = Topology(world_size=2, compute_device="cpu", ddr_cap=100 * 2**20)
    cons = {t.name: ParameterConstraints(sharding_types=["table_wise"]) for t in tables}
    with pytest.raises(PlannerError, match=r"6 table-wise tables need \d+ bytes"):
        planner(agent, topology=topo, constraints=cons).plan(dlrm(tables), SHARDERS)


def test_partitioner_keeps_ranks_and_rejects_unranked():
    t = torch.empty(10, 4, device=META)
    ebc = EmbeddingBagCollection(configs(1), device=META)
    option = ShardingOption(
        name="t0",
        tensor=t,
        module=("ebc", ebc),
        input_lengths=[1.0],
        batch_size=8,
        sharding_type="table_wise",
        partition_by="device",
        compute_kernel="fused",
        shards=[Shard(size=[10, 4], offset=[0, 0], storage=Storage(hbm=0, ddr=100))],
    )
    topo = Topology(world_size=2, compute_device="cpu", ddr_cap=1000)
    with pytest.raises(PlannerError, match="no rank"):
        DreamShardPartitioner().partition([option], topo)
    option.shards[0].rank = 1
    assert DreamShardPartitioner().partition([option], topo)[0].shards[0].rank == 1
    option.shards[0].storage = Storage(hbm=0, ddr=5000)
    with pytest.raises(PlannerError, match="rank 1 is over its memory"):
        DreamShardPartitioner().partition([option], topo)


def test_reuse_statistics_from_sample_batches(agent):
    tables = configs(3)
    batches = [
        KeyedJaggedTensor.from_lengths_sync(
            keys=["tf0", "tf1", "tf2"],
            values=torch.randint(0, 50, (3 * 8 * 4,), generator=torch.Generator().manual_seed(s)),
            lengths=torch.full((3 * 8,), 4, dtype=torch.int32),
        )
        for s in range(4)
    ]
    p = planner(agent, world=2, sample_batches=batches)
    p.plan(dlrm(tables), SHARDERS)
    specs = p.table_specs.specs
    assert len(specs) == 3
    assert all(s.reuse_hist is not None for s in specs.values())


def test_demo_model_planned_from_its_sample_batches(agent):
    """The demo's model and batches: every table placed, its pooling factor from the
    constraints and its reuse histogram measured from the KJT batches."""
    from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool
    from torchrec_dreamshard.evaluation.step_model import StepDLRM, StepModelSpec, sample_kjt
    from torchrec_dreamshard.planner.adapters.torchrec_adapter import table_wise_constraints

    tables = synthetic_pool(6, scale=CPU_POOL_SCALE, seed=3)
    batches = [sample_kjt(tables, 32, seed=s) for s in range(2)]
    p = planner(
        agent,
        world=2,
        batch_size=32,
        sample_batches=batches,
        constraints=table_wise_constraints(tables),
    )
    plan = p.plan(StepDLRM(StepModelSpec(bags=tables), META), SHARDERS)
    assert sorted(plan.plan["sparse"]) == sorted(t.name for t in tables)
    specs = p.table_specs.specs
    for t in tables:
        spec = specs[f"sparse.{t.name}"]
        assert spec.pooling_factor == pytest.approx(t.pooling_factor)
        assert spec.reuse_hist is not None and sum(spec.reuse_hist) == pytest.approx(1.0)


def test_search_mode_is_deterministic(agent):
    plans = [
        planner(agent, world=4, mode="search", num_samples=4, seed=3).plan(
            dlrm(configs(8)), SHARDERS
        )
        for _ in range(2)
    ]
    assert str(plans[0]) == str(plans[1])


def test_bad_arguments_are_rejected(agent):
    with pytest.raises(ValueError, match="mode"):
        planner(agent, mode="best")
    with pytest.raises(ValueError, match="batch_size"):
        planner(agent, batch_size=-1)


def test_checkpoint_path_is_loaded(tmp_path):
    from torchrec_dreamshard.policy.checkpoint import save_checkpoint

    path = tmp_path / "agent.pt"
    save_checkpoint(DreamShard.untrained(seed=1), path)
    p = DreamShardPlanner(
        topology=Topology(world_size=2, compute_device="cpu"), batch_size=32, checkpoint=path
    )
    plan = p.plan(dlrm(configs(3)), SHARDERS)
    assert len(plan.plan["sparse_arch.embedding_bag_collection"]) == 3
    with pytest.raises(ValueError, match="does not exist"):
        DreamShardPlanner(
            topology=Topology(world_size=2, compute_device="cpu"), checkpoint=tmp_path / "no.pt"
        )


def test_planner_uses_the_bundled_checkpoint_by_default():
    p = DreamShardPlanner(topology=Topology(world_size=2, compute_device="cpu"), batch_size=1024)
    assert p.agent.meta["trained"] is True
    plan = p.plan(dlrm(configs(4)), SHARDERS)
    assert len(plan.plan["sparse_arch.embedding_bag_collection"]) == 4


_LAZY_PROBE = """
import json, sys
import torchrec_dreamshard
planners = ("torchrec.distributed.planner", "torchrec_dreamshard.planner")
loaded = sorted(m for m in sys.modules if m.startswith(planners))
exported = torchrec_dreamshard.DreamShardPlanner
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec_dreamshard.planner.planners import DreamShardPlanner
try:
    torchrec_dreamshard.NoSuchPlanner
    missing = ""
except AttributeError as exc:
    missing = str(exc)
print(json.dumps({
    "loaded": loaded,
    "same": exported is DreamShardPlanner,
    "torchrecs": issubclass(exported, EmbeddingShardingPlanner),
    "all": torchrec_dreamshard.__all__,
    "missing": missing,
}))
"""


def test_the_package_exports_the_planner_without_importing_it():
    """``import torchrec_dreamshard`` (the data and CLI side) loads neither TorchRec's
    planner nor ours; ``torchrec_dreamshard.DreamShardPlanner`` then is the planner, a
    TorchRec ``EmbeddingShardingPlanner``; any other name is an ``AttributeError``. Run in
    a fresh interpreter: this module has imported both planners already."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run(
        [sys.executable, "-c", _LAZY_PROBE], capture_output=True, text=True, env=env, check=True
    )
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe["loaded"] == []
    assert probe["same"] and probe["torchrecs"]
    assert "DreamShardPlanner" in probe["all"]
    assert "NoSuchPlanner" in probe["missing"]


class _ScriptedAgent:
    """Returns the placements it is given, one per call, recording each task's memory."""

    def __init__(self, placements):
        self.placements, self.memory = list(placements), []
        self.last_report = None

    def place(self, task, mode="greedy", num_samples=16, seed=0, sources=None):
        self.memory.append(list(task.memory))
        return self.placements[min(len(self.memory), len(self.placements)) - 1]


def _four_tables() -> dict:
    """The scripted partitioner's tables, by name: 64,000 bytes of weights each."""
    from torchrec_dreamshard.data.tables import TableSpec

    return {
        f"t{i}": TableSpec(name=f"t{i}", rows=1000, dim=16, pooling_factor=1.0) for i in range(4)
    }


def _partitioner_with(monkeypatch, agent, need: int):
    from types import SimpleNamespace

    from torchrec_dreamshard.planner.stages import partitioners
    from torchrec_dreamshard.planner.stages.placement import PolicyPlacer

    specs = _four_tables()
    monkeypatch.setattr(partitioners, "option_bytes", lambda option, tier: need)
    partitioner = partitioners.DreamShardPartitioner(
        placer=PolicyPlacer(agent, 64), spec_fn=lambda option: specs[option.fqn]
    )
    ours = [SimpleNamespace(fqn=name, shards=[SimpleNamespace(rank=None)]) for name in specs]
    return partitioner, ours


def test_partitioner_shrinks_an_overfull_device_and_places_again(monkeypatch):
    """TorchRec's estimate (100 kB a table) exceeds device 0's 250 kB after the first
    placement: device 0's share shrinks in proportion, the others' stay, and the policy
    places again."""
    from torchrec_dreamshard.planner.stages.partitioners import MEMORY_SHRINK

    agent = _ScriptedAgent([[0, 0, 0, 1], [0, 0, 1, 1]])
    partitioner, ours = _partitioner_with(monkeypatch, agent, need=100_000)
    placed = partitioner._place_policy(ours, [250_000, 250_000], "ddr", {})
    assert [o.shards[0].rank for o in placed] == [0, 0, 1, 1]
    first, second = agent.memory
    assert first == [160_000, 160_000]  # weights (256 kB) / estimate (400 kB) of what is left
    assert second == [int(160_000 * 250_000 / 300_000 * MEMORY_SHRINK), 160_000]


def test_a_shrunk_share_keeps_room_for_a_table_no_other_share_holds():
    """Shrinking an overfull device never shuts its biggest table out of every device: the
    share keeps that table's weights (the bursty task's first table, 48.9 MB of weights on
    the one device whose share was raised to 50.2 MB, was shut out by a shrink to 48.2 MB
    and the plan failed); the device's other tables are what must move."""
    from torchrec_dreamshard.data.tables import TableSpec
    from torchrec_dreamshard.planner.stages.partitioners import MEMORY_SHRINK, shrunk_caps

    big = TableSpec(name="big", rows=1000, dim=100, pooling_factor=1.0)  # 400 kB
    small = TableSpec(name="small", rows=100, dim=100, pooling_factor=1.0)  # 40 kB
    caps = [450_000, 300_000]
    out = shrunk_caps(caps, {0: (450_000, 500_000)}, [big, small], {"big": 0, "small": 0})
    assert int(450_000 * 450_000 / 500_000 * MEMORY_SHRINK) < big.size_bytes
    assert out == [big.size_bytes, 300_000]
    # where another share holds the table, the device shrinks in proportion
    wider = shrunk_caps([450_000, 420_000], {0: (450_000, 500_000)}, [big, small], {"big": 0})
    assert wider == [int(450_000 * 450_000 / 500_000 * MEMORY_SHRINK), 420_000]


def test_partitioner_gives_up_after_its_memory_rounds(monkeypatch):
    """Where TorchRec's planner finds no plan either, a policy that keeps overflowing a
    device ends in TorchRec's storage error, naming the tables and the device."""
    from torchrec_dreamshard.planner.stages.partitioners import MAX_MEMORY_ROUNDS
    from torchrec_dreamshard.planner.stages.placement import PolicyPlacer

    monkeypatch.setattr(PolicyPlacer, "torchrec_plan", lambda self, specs, memory: None)
    agent = _ScriptedAgent([[0, 0, 0, 1]])  # a policy that ignores the shrunk share
    partitioner, ours = _partitioner_with(monkeypatch, agent, need=100_000)
    with pytest.raises(PlannerError, match=r"tables \['t0', 't1', 't2'\] on devices \[0\]"):
        partitioner._place_policy(ours, [250_000, 1_000_000], "ddr", {})
    assert len(agent.memory) == MAX_MEMORY_ROUNDS
    caps0 = [m[0] for m in agent.memory]
    assert caps0 == sorted(caps0, reverse=True) and len(set(caps0)) == MAX_MEMORY_ROUNDS


def test_torchrecs_plan_is_the_plan_where_the_policy_keeps_overflowing(monkeypatch):
    """Where the policy keeps overflowing TorchRec's estimate, TorchRec's own plan of the
    same tables in the memory left (which fits by TorchRec's count) is the plan."""
    from torchrec_dreamshard.data.tasks import Task
    from torchrec_dreamshard.planner.stages.candidates import torchrec_placement
    from torchrec_dreamshard.planner.stages.partitioners import MAX_MEMORY_ROUNDS

    agent = _ScriptedAgent([[0, 0, 0, 1]])  # a policy that ignores the shrunk share
    partitioner, ours = _partitioner_with(monkeypatch, agent, need=100_000)
    specs = list(_four_tables().values())
    left = [250_000, 1_000_000]
    placed = partitioner._place_policy(ours, left, "ddr", {})
    assert len(agent.memory) == MAX_MEMORY_ROUNDS
    task = Task(tables=specs, num_devices=2, memory_bytes=left, batch_size=64)
    expected = torchrec_placement(task, accounting="unreserved")
    assert [o.shards[0].rank for o in placed] == expected


def test_the_first_shares_admit_torchrecs_plan_and_later_ones_may_not(monkeypatch):
    """The policy's first shares are raised to the weights TorchRec's plan puts on each
    device; a share shrunk after an overflow is not, and the baseline then declines the
    policy's task with its reason rather than offering a plan that does not fit it."""
    from torchrec_dreamshard.data.tasks import NoPlanError, Task
    from torchrec_dreamshard.planner.stages.candidates import torchrec_placement

    agent = _ScriptedAgent([[0, 0, 0, 1], [0, 1, 1, 1]])
    partitioner, ours = _partitioner_with(monkeypatch, agent, need=100_000)
    specs = list(_four_tables().values())
    left = [250_000, 1_000_000]
    partitioner._place_policy(ours, left, "ddr", {})
    task = Task(tables=specs, num_devices=2, memory_bytes=left, batch_size=64)
    expected = torchrec_placement(task, accounting="unreserved")
    weights = [
        sum(s.size_bytes for s, d in zip(specs, expected, strict=True) if d == k) for k in (0, 1)
    ]
    first, second = agent.memory[:2]
    assert all(cap >= w for cap, w in zip(first, weights, strict=True))
    own = partitioner.placer.how.sources[0]
    assert second[0] < first[0] and second[1] == first[1]  # device 0's share shrank
    below = Task(
        tables=specs, num_devices=2, memory_bytes=[weights[0] - 1, second[1]], batch_size=64
    )
    with pytest.raises(NoPlanError, match=r"devices \[0\] than the policy's share"):
        own.propose(below)
    assert (
        own.propose(Task(tables=specs, num_devices=2, memory_bytes=first, batch_size=64))
        == expected
    )


def test_torchrecs_plan_is_the_plan_where_the_shares_leave_a_table_no_room(monkeypatch):
    """A placement the policy cannot make in its shares (a storage ``PlannerError`` from
    the placer) ends the memory rounds; TorchRec's own plan, which fits, is the plan."""
    from torchrec_dreamshard.data.tasks import Task
    from torchrec_dreamshard.planner.stages.candidates import torchrec_placement
    from torchrec_dreamshard.planner.stages.placement import PolicyPlacer

    agent = _ScriptedAgent([[0, 0, 0, 1]])  # a policy that ignores the shrunk share
    partitioner, ours = _partitioner_with(monkeypatch, agent, need=100_000)
    specs = list(_four_tables().values())

    def no_room(self, specs, memory, widths):
        agent.memory.append(list(memory))
        raise PlannerError("no room", PlannerErrorType.INSUFFICIENT_STORAGE)

    monkeypatch.setattr(PolicyPlacer, "place", no_room)
    left = [250_000, 1_000_000]
    placed = partitioner._place_policy(ours, left, "ddr", {})
    task = Task(tables=specs, num_devices=2, memory_bytes=left, batch_size=64)
    assert [o.shards[0].rank for o in placed] == torchrec_placement(task, accounting="unreserved")
    assert len(agent.memory) == 1


def test_a_checkpoint_from_another_cpu_is_named_and_calibration_suggested(caplog):
    """Planning for CPU ranks with calibration off and a cost network trained on another
    CPU model warns (and says to calibrate); the same CPU, GPU ranks or calibrating, by
    request or by default, say nothing."""
    import logging

    from torchrec_dreamshard.measure.hardware import cpu_name
    from torchrec_dreamshard.planner.defaults import adapt_settings, other_hardware

    class Agent:
        def __init__(self, name):
            self.meta = {"hardware": {"device": "cpu", "device_name": name}}

    cpu = Topology(world_size=2, compute_device="cpu")
    note = other_hardware(Agent("Some Other CPU 9000"), cpu)
    assert note and "Some Other CPU 9000" in note and cpu_name() in note and "calibrate" in note
    assert other_hardware(Agent(cpu_name()), cpu) is None
    gpu = Topology(world_size=2, compute_device="cuda")
    assert other_hardware(Agent("Some Other CPU 9000"), gpu) is None
    with caplog.at_level(logging.WARNING, logger="torchrec_dreamshard.planner"):
        adapt_settings(Agent("Some Other CPU 9000"), cpu, False, 0)  # calibration off
        assert "Some Other CPU 9000" in caplog.text
        caplog.clear()
        adapt_settings(Agent("Some Other CPU 9000"), cpu, 5.0, 0)
        assert caplog.text == ""
        # the default checks the machine itself (and calibrates where it must)
        adapt_settings(DreamShard.untrained(seed=0), cpu, None, 0)
        assert caplog.text == ""


def test_a_big_table_that_fits_a_device_by_its_own_storage_gets_a_device_to_fit():
    """The policy counts weight bytes, scaled from TorchRec's storage by all the tables'
    ratio. A big table whose buffers are small beside its weights (9/9.5 of its storage)
    next to many small tables with big buffers (1/3) would fit no scaled device, though
    its storage fits one: that device's cap is raised to its weights, one device per such
    table, and a table whose storage fits nowhere raises none."""
    from torchrec_dreamshard.data.tables import TableSpec
    from torchrec_dreamshard.planner.stages.partitioners import policy_caps

    big = TableSpec(name="big", rows=225, dim=1, pooling_factor=1.0)  # 900 bytes
    small = [TableSpec(name=f"s{i}", rows=5, dim=1, pooling_factor=1.0) for i in range(25)]
    need = [950] + [60] * 25  # weights 900 + 500, storage 950 + 1500: ratio 0.571
    left = [1000, 1000, 1010]
    caps = policy_caps([big, *small], need, left)
    assert caps == [571, 571, 900]  # the device with the most left, for the big table
    assert policy_caps([*small], [60] * 25, left) == [333, 333, 336]  # no table shut out
    # its storage (1100) fits no device: no cap is raised for it
    assert policy_caps([big, *small], [1100] + [60] * 25, left) == [538, 538, 543]
