"""Planning at the scale the README quotes: 1000 tables on 64 devices; and at production
scale with every sharding type: 1000 tables on 128 GPUs over hosts of 8, 4 and 2.

The model is ``benchmarks/planning_time.py``'s (an ``EmbeddingBagCollection`` of 1000
full-scale tables of the synthetic DLRM-shaped pool on the meta device, their pooling
factors as constraints), planned by the default ``DreamShardPlanner`` for 64 CUDA devices
with TorchRec's sharder, which offers every sharding type there. 1000 x 64 is past
:data:`~torchrec_dreamshard.policy.agent.LARGE_TASK`, so this is the bounded path the
safe mode and the enumerator take on large models, which no smaller test reaches. Each
device has 5 GB (or 4 GB: tighter still): the largest table fits none whole, and the others
fill the devices to within a few percent of what TorchRec's storage reservation leaves.

The test asserts a valid plan (every table placed, whole, on ranks that exist, no device
over its memory) and that the bounded path is the one taken. It bounds no time: a shared
CI core may be many times slower than an idle one, and the README's figure (about 1.5 s on
an idle machine) is ``benchmarks/planning_time.py --compare --tables 1000 --devices 64``'s.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.types import Topology
from torchrec.distributed.types import ShardingType

from torchrec_dreamshard.planner import DreamShardPlanner
from torchrec_dreamshard.planner.adapters.torchrec_adapter import (
    planner_best_plan,
    planner_reserved_topology,
)
from torchrec_dreamshard.planner.type_choice.type_offers import offered_types
from torchrec_dreamshard.policy.agent import LARGE_TASK

TABLES, DEVICES = 1000, 64
LOCAL_BATCH = 512
HBM_CAP = 5 * 2**30  # the largest table (4.1 GB of weights) fits no device whole
# the devices about 83% full by TorchRec's storage estimate; a 2.3 GB table of dim 128 (too
# narrow to split) fits a device by its own storage, but not by the weight-to-storage ratio
# of all the tables together (the partitioner's policy_caps)
TIGHT_HBM_CAP = 4 * 2**30

pytestmark = pytest.mark.usefixtures("quiet")


def model_and_constraints():
    """``benchmarks/planning_time.py``'s model of :data:`TABLES` tables and constraints."""
    benchmarks = str(Path(__file__).resolve().parents[1] / "benchmarks")
    sys.path.insert(0, benchmarks)
    try:
        from planning_time import build
    finally:
        sys.path.remove(benchmarks)
    return build(TABLES)


@pytest.mark.slow
@pytest.mark.parametrize("hbm_cap", [HBM_CAP, TIGHT_HBM_CAP], ids=["5GB", "4GB"])
def test_1000_tables_on_64_devices_with_every_sharding_type_get_a_valid_plan(hbm_cap):
    model, constraints = model_and_constraints()
    assert TABLES * DEVICES > LARGE_TASK  # the safe mode's bounded path
    sharder = EmbeddingBagCollectionSharder()
    offered = set(sharder.sharding_types("cuda"))
    assert offered == {t.value for t in ShardingType}, offered  # every type TorchRec has
    topology = Topology(world_size=DEVICES, compute_device="cuda", hbm_cap=hbm_cap)
    planner = DreamShardPlanner(topology=topology, batch_size=LOCAL_BATCH, constraints=constraints)
    plan = planner.plan(model, [sharder])

    # every table placed, on ranks that exist, every row and column of it once
    module_plan = plan.plan[""]
    tables = {t.name: t for t in model.embedding_bag_configs()}
    assert sorted(module_plan) == sorted(tables)
    for name, ps in module_plan.items():
        assert ps.ranks and all(0 <= r < DEVICES for r in ps.ranks), (name, ps.ranks)
        if ps.sharding_type == "data_parallel":
            continue
        shards = ps.sharding_spec.shards
        area = sum(s.shard_sizes[0] * s.shard_sizes[1] for s in shards)
        assert area == tables[name].num_embeddings * tables[name].embedding_dim, name
        assert sorted(s.placement.rank() for s in shards) == sorted(ps.ranks), name
    assert any(len(ps.ranks) > 1 for ps in module_plan.values())  # the largest, split

    # no device over what TorchRec's storage reservation leaves of its memory
    used = [[0, 0] for _ in range(DEVICES)]
    for option in planner_best_plan(planner):
        for shard in option.shards:
            used[shard.rank][0] += shard.storage.hbm
            used[shard.rank][1] += shard.storage.ddr
    devices = planner_reserved_topology(planner).devices
    for rank, ((hbm, ddr), device) in enumerate(zip(used, devices, strict=True)):
        assert hbm <= device.storage.hbm and ddr <= device.storage.ddr, (rank, hbm, ddr)
    assert max(hbm / d.storage.hbm for (hbm, _), d in zip(used, devices, strict=True)) > 0.5


# --- production scale, every sharding type -------------------------------------------------

PROD_DEVICES, PROD_BATCH = 128, 8192


def production_model(tables: int = TABLES):
    """An ``EmbeddingBagCollection`` on meta: 1e3-5e7 rows log-uniform, dims 16-256,
    pooling factor 1 (``benchmarks/at_scale.py``'s model)."""
    import numpy as np
    import torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    rng = np.random.default_rng(0)
    rows = np.exp(rng.uniform(np.log(1e3), np.log(5e7), tables)).astype(int)
    dims = rng.choice([16, 32, 64, 128, 256], tables)
    configs = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=int(d), num_embeddings=int(r), feature_names=[f"f{i}"]
        )
        for i, (r, d) in enumerate(zip(rows, dims, strict=True))
    ]

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))

    return Model()


def check_sharding_plan(plan, model, devices: int) -> None:
    """The plan as TorchRec code that consumes a ``ShardingPlan`` reads it: the module's
    plan by path, every table once, each sharded table's shards (validated by torch's
    ``EnumerableShardingSpec``: no overlap) covering it exactly, on the ranks it names."""
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec

    module_plan = plan.get_plan_for_module("ebc")
    tables = {t.name: t for t in model.ebc.embedding_bag_configs()}
    assert sorted(module_plan) == sorted(tables)
    for name, ps in module_plan.items():
        ranks = ps.ranks
        assert ranks and all(0 <= r < devices for r in ranks), (name, ranks)
        if ps.sharding_type == "data_parallel":
            assert sorted(ranks) == list(range(devices)), name
            continue
        spec = ps.sharding_spec
        EnumerableShardingSpec(list(spec.shards))  # raises on overlapping shards
        size = [tables[name].num_embeddings, tables[name].embedding_dim]
        assert sum(s.shard_sizes[0] * s.shard_sizes[1] for s in spec.shards) == size[0] * size[1]
        for s in spec.shards:
            assert all(
                o + n <= m for o, n, m in zip(s.shard_offsets, s.shard_sizes, size, strict=True)
            ), name
        assert sorted(s.placement.rank() for s in spec.shards) == sorted(ranks), name


@pytest.mark.slow
@pytest.mark.parametrize(
    "local",
    [
        8,
        pytest.param(4, marks=pytest.mark.another_size),
        pytest.param(2, marks=pytest.mark.another_size),
    ],
)
def test_1000_tables_on_128_gpus_choose_types_and_plan_a_valid_sharding(local):
    """1000 production-shaped tables on 128 GPUs of 80 GB, ``local`` per host, every type
    allowed: the type choice runs (and is timed); where it predicts a gain beyond its
    uncertainty the plan has more than one type; no device over its memory; every
    table-row-wise table within one host; the ``ShardingPlan`` reads as TorchRec reads it."""
    from torchrec.distributed.sharding_plan import get_default_sharders

    model = production_model()
    topology = Topology(
        world_size=PROD_DEVICES, local_world_size=local, compute_device="cuda", hbm_cap=80 * 2**30
    )
    offers = offered_types(model, topology, PROD_BATCH)
    assert sum(bool(o) for o in offers.values()) == TABLES  # every table offered another type
    planner = DreamShardPlanner(topology=topology, batch_size=PROD_BATCH)
    # how long it takes is benchmarks/planning_time.py's and at_scale.py's to say
    plan = planner.plan(model, get_default_sharders())

    chosen = planner.proposer.last_types
    assert chosen is not None and chosen.decisions  # the type choice ran
    types = {ps.sharding_type for ps in plan.plan["ebc"].values()}
    if any(d.kept for d in chosen.decisions):
        assert len(types) > 1, types
        assert chosen.step_ms < chosen.table_wise_ms
    assert planner.adaptation["types"]["summary"]["tables"]

    check_sharding_plan(plan, model, PROD_DEVICES)
    for name, ps in plan.plan["ebc"].items():
        if ps.sharding_type in ("table_row_wise", "grid_shard"):
            assert len({r // local for r in ps.ranks}) == 1, (name, ps.ranks)

    used = [0] * PROD_DEVICES
    for option in planner_best_plan(planner):
        for shard in option.shards:
            used[shard.rank] += shard.storage.hbm
    devices = planner_reserved_topology(planner).devices
    assert all(u <= d.storage.hbm for u, d in zip(used, devices, strict=True))
