"""Planner-level plan regression: what ``DreamShardPlanner`` plans on a fixed set of
meta-device models, recorded in ``tests/data/planner_regression.json``, so that a
refactor of the planner can show it changed no plan.

Every case plans with the bundled checkpoint as it is (``calibrate=False``), fixed
collective and dense-kernel models (conftest's ``GLOO_LIKE`` and ``CPU_DENSE_LIKE``, or a
case's own) and, as conftest pins for every test, no measured reference kernel. The cases
exercise: tables moved to data-parallel by the type choice, column-wise splits (a table too
big for any device, ``min_partition``), the policy re-run when TorchRec's storage
estimate overflows a device, a user proposer (and a user enumerator, partitioner and
perf model), sequence (``EmbeddingCollection``) tables, constraints forbidding table-wise,
several world sizes and hosts (row-wise and table-row-wise chosen), the three modes,
measured reuse statistics, and the two errors TorchRec's planner classifies.

Per case it records every table's sharding type, compute kernel, ranks and shard sizes
and offsets, the cost network's predicted step, the proposer that won, or the error (class,
``PlannerErrorType`` and message).

A plan made on another CPU need not be the recorded one bit for bit
(:mod:`harness.golden_plans`): plans are compared up to a
relabelling of identical devices (what each device holds, devices interchangeable within a
host and hosts with each other), with the predicted step within ``TIE_RTOL``; another plan
whose predicted step is within ``TIE_RTOL`` of the recorded one is a tie and passes too.
A plan predicted slower or faster beyond that fails (``test_a_worse_plan_fails``). Errors
are compared exactly.

Record (only on purpose, from code whose plans are the reference)::

    RECORD_PLANNER_REGRESSION=1 .venv/bin/pytest -q tests/test_plan_regression_planner.py
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import CPU_DENSE_LIKE, GLOO_LIKE
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.perf_models import NoopPerfModel
from torchrec.distributed.planner.proposers import GreedyProposer
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError, Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.models.dlrm import DLRM
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from torchrec_dreamshard.cost.collective_models import CollectiveModels
from torchrec_dreamshard.cost.comm_model import CommModel
from torchrec_dreamshard.measure.collective_timing import COLLECTIVES
from torchrec_dreamshard.planner import DreamShardPlanner

from harness.golden_plans import (
    TIE_RTOL,
    canonical_partition,
    plan_differences,
)

META = torch.device("meta")
PATH = Path(__file__).parent / "data" / "planner_regression.json"
RECORD = os.environ.get("RECORD_PLANNER_REGRESSION") == "1"
EBC = [EmbeddingBagCollectionSharder()]
BOTH = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]

pytestmark = pytest.mark.usefixtures("quiet")


# -- models -------------------------------------------------------------------------------


def bags(n: int, rows: int = 1000, dim: int = 16, prefix: str = "t", step: int = 1) -> list:
    return [
        EmbeddingBagConfig(
            name=f"{prefix}{i}",
            embedding_dim=dim,
            num_embeddings=rows * (1 + step * i),
            feature_names=[f"{prefix}f{i}"],
        )
        for i in range(n)
    ]


def table(name: str, rows: int, dim: int) -> EmbeddingBagConfig:
    return EmbeddingBagConfig(
        name=name, embedding_dim=dim, num_embeddings=rows, feature_names=[f"f_{name}"]
    )


def sequence(name: str, rows: int, dim: int) -> EmbeddingConfig:
    return EmbeddingConfig(
        name=name, embedding_dim=dim, num_embeddings=rows, feature_names=[f"s_{name}"]
    )


def tiny_and_big(n_tiny: int = 12, n_big: int = 4) -> list:
    return bags(n_tiny, rows=50, dim=8, prefix="tiny", step=0) + bags(
        n_big, rows=200_000, dim=64, prefix="big", step=0
    )


class Model(torch.nn.Module):
    def __init__(self, tables: list, sequences: list | None = None) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=tables, device=META)
        if sequences:
            self.ec = EmbeddingCollection(tables=sequences, device=META)


def dlrm(tables: list) -> DLRM:
    return DLRM(
        embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=META),
        dense_in_features=4,
        dense_arch_layer_sizes=[8, tables[0].embedding_dim],
        over_arch_layer_sizes=[8, 1],
        dense_device=META,
    )


def comm(latency_ms: float, ms_per_mb: float) -> CollectiveModels:
    model = CommModel(latency_ms=latency_ms, per_peer_ms=0.0, ms_per_mb=ms_per_mb)
    return CollectiveModels(backend="test", models=dict.fromkeys(COLLECTIVES, model))


def analytic(topology: Topology) -> CollectiveModels:
    """The collective models ``DreamShardPlanner`` prices accelerators with by default."""
    from torchrec_dreamshard.cost.comm_topology import CommTopology, analytic_models

    return analytic_models(CommTopology.from_torchrec(topology))


def cpu(world: int, local: int | None = None, ddr: int | None = None) -> Topology:
    kw = {"ddr_cap": ddr} if ddr else {}
    if local is not None:
        kw["local_world_size"] = local
    return Topology(world_size=world, compute_device="cpu", **kw)


def pooling(names, factor: float, **kw) -> dict[str, ParameterConstraints]:
    return {n: ParameterConstraints(pooling_factors=[factor], **kw) for n in names}


# -- cases: name -> () -> (planner keywords, model, sharders) -----------------------------

Case = Callable[[], tuple[dict, torch.nn.Module, list]]


def _dp_dear_bandwidth():
    return {"topology": cpu(4), "collectives": comm(0.0, 100.0)}, Model(tiny_and_big()), EBC


def _gloo_like_w4():
    cons = pooling([f"big{i}" for i in range(4)], 8.0)
    return {"topology": cpu(4), "constraints": cons}, Model(tiny_and_big()), EBC


def _cheap_collectives_w2():
    return {"topology": cpu(2), "collectives": comm(0.0, 0.0)}, Model(tiny_and_big(6, 3)), EBC


def _constraints_bound_the_choice():
    cons = {f"tiny{i}": ParameterConstraints(sharding_types=["table_wise"]) for i in range(6)}
    kw = {"topology": cpu(4), "collectives": comm(0.0, 100.0), "constraints": cons}
    return kw, Model(tiny_and_big()), EBC


def _forbid_table_wise():
    cons = {
        "t1": ParameterConstraints(sharding_types=["column_wise"]),
        "t3": ParameterConstraints(sharding_types=["data_parallel"]),
        "t5": ParameterConstraints(sharding_types=["table_column_wise"]),
    }
    return {"topology": cpu(2), "constraints": cons}, dlrm(bags(7)), EBC


def _forbid_table_wise_hosts():
    cons = {
        "t0": ParameterConstraints(sharding_types=["table_row_wise"]),
        "t2": ParameterConstraints(sharding_types=["row_wise", "column_wise"]),
        "t4": ParameterConstraints(compute_kernels=["dense"]),
    }
    topo = Topology(world_size=4, local_world_size=2, compute_device="cuda", hbm_cap=2**30)
    return {"topology": topo, "constraints": cons}, Model(bags(8, rows=5000)), EBC


def _split_too_big_min_partition():
    tables = bags(4, rows=1000, dim=64) + [table("huge", 400_000, 64)]
    cons = {"huge": ParameterConstraints(min_partition=16)}
    kw = {"topology": cpu(4, ddr=80 * 2**20), "constraints": cons}
    return kw, dlrm(tables), EBC


def _split_too_big_default_width():
    tables = bags(6, rows=2000, dim=32) + [table("wide", 100_000, 512)]
    kw = {"topology": cpu(4, ddr=150 * 2**20)}
    return kw, Model(tables), EBC


def _split_hot_wide():
    tables = bags(8, rows=1000, dim=16) + [table("hot", 20_000, 256)]
    cons = {"hot": ParameterConstraints(min_partition=32, pooling_factors=[60.0])}
    kw = {"topology": cpu(4), "constraints": cons, "collectives": comm(0.0, 0.0)}
    return kw, Model(tables), EBC


def _memory_tight():
    tables = bags(12, rows=20_000, dim=32)
    total = sum(t.num_embeddings * t.embedding_dim * 4 for t in tables)
    return {"topology": cpu(4, ddr=int(total / 4 * 1.6))}, dlrm(tables), EBC


def _memory_tighter():
    tables = bags(10, rows=30_000, dim=32, step=2)
    total = sum(t.num_embeddings * t.embedding_dim * 4 for t in tables)
    return {"topology": cpu(3, ddr=int(total / 3 * 1.35))}, Model(tables), EBC


def _memory_retry():
    """TorchRec's storage estimate overflows a device the policy filled by weights: the
    policy runs again with that device's share shrunk (three runs here)."""
    tables = bags(6, rows=40_000, dim=16, prefix="long") + bags(
        6, rows=2000, dim=128, prefix="wide"
    )
    total = sum(t.num_embeddings * t.embedding_dim * 4 for t in tables)
    cons = pooling([f"wide{i}" for i in range(6)], 20.0)
    kw = {"topology": cpu(4, ddr=int(total / 4 * 1.75)), "constraints": cons, "batch_size": 512}
    return kw, Model(tables), EBC


def _user_proposer():
    return {"topology": cpu(2), "proposer": GreedyProposer()}, Model(bags(6)), EBC


def _user_proposer_with_types():
    kw = {"topology": cpu(4), "proposer": [GreedyProposer()], "collectives": comm(0.0, 100.0)}
    return kw, Model(tiny_and_big(6, 2)), EBC


def _user_enumerator():
    cons = {"t1": ParameterConstraints(sharding_types=["data_parallel"])}
    topo = cpu(2)
    enumerator = EmbeddingEnumerator(topo, 64, cons)
    kw = {"topology": topo, "constraints": cons, "enumerator": enumerator}
    return kw, Model(bags(5)), EBC


def _user_partitioner_and_perf_model():
    cons = {"t1": ParameterConstraints(sharding_types=["data_parallel"])}
    topo = cpu(2)
    kw = {
        "topology": topo,
        "constraints": cons,
        "partitioner": GreedyPerfPartitioner(),
        "performance_model": NoopPerfModel(topo),
        "proposer": GreedyProposer(),
    }
    return kw, Model(bags(5)), EBC


def _sequences_dear():
    # on CUDA ranks: on CPU ranks a sequence table is never data-parallel (the enumerator's
    # _runnable_types), and this case is here for the type choice replicating one
    seq = [sequence("hist", 200, 16)]
    cons = {"hist": ParameterConstraints(pooling_factors=[30.0])}
    topo = Topology(world_size=4, compute_device="cuda")
    kw = {"topology": topo, "constraints": cons, "collectives": comm(0.0, 100.0)}
    return kw | {"batch_size": 512}, Model(tiny_and_big(2), seq), BOTH


def _sequences_gloo_like():
    seq = [sequence(f"s{i}", 5000 * (i + 1), 32) for i in range(3)]
    cons = {"s0": ParameterConstraints(pooling_factors=[10.0])}
    return {"topology": cpu(2), "constraints": cons}, Model(bags(4), seq), BOTH


def _hosts_cpu_hot():
    hot = [table(f"hot{i}", 2_000_000, 128) for i in range(2)]
    cons = pooling(["hot0", "hot1"], 200.0)
    kw = {"topology": cpu(8, local=4), "constraints": cons}
    return kw, Model(hot + tiny_and_big(4, 2)), get_default_sharders()


def _hosts_cuda_hot():
    hot = [table(f"hot{i}", 2_000_000, 128) for i in range(2)]
    cons = pooling(["hot0", "hot1"], 200.0)
    topo = Topology(world_size=16, local_world_size=8, compute_device="cuda", hbm_cap=32 * 2**30)
    kw = {"topology": topo, "constraints": cons, "collectives": analytic(topo)}
    return kw, Model(hot + tiny_and_big(4)), get_default_sharders()


def _hosts_cuda_many():
    tables = bags(24, rows=30_000, dim=64, step=3) + [table("hot", 1_000_000, 128)]
    cons = pooling(["hot"], 100.0) | pooling(["t0", "t1", "t2"], 20.0)
    topo = Topology(world_size=8, local_world_size=2, compute_device="cuda", hbm_cap=16 * 2**30)
    return {"topology": topo, "constraints": cons}, Model(tables), EBC


def _hosts_mixed(world: int, local: int, collectives: CollectiveModels | None) -> Case:
    """Two hot tables, eight tiny and two big on GPUs over hosts: with dear collectives
    the type choice replicates the tiny tables and spreads the hot ones (the best of each
    type together)."""

    def case():
        hot = [table(f"hot{i}", 2_000_000, 128) for i in range(2)]
        topo = Topology(
            world_size=world, local_world_size=local, compute_device="cuda", hbm_cap=32 * 2**30
        )
        kw = {"topology": topo, "constraints": pooling(["hot0", "hot1"], 200.0), "batch_size": 512}
        if collectives is not None:
            kw["collectives"] = collectives
        return kw, Model(hot + tiny_and_big(8, 2)), get_default_sharders()

    return case


def _world_16():
    return {"topology": cpu(16)}, Model(bags(30, rows=3000, dim=32, step=1)), EBC


def _greedy_mode():
    return {"topology": cpu(4), "mode": "greedy"}, dlrm(bags(8)), EBC


def _search_mode():
    return {"topology": cpu(4), "mode": "search", "num_samples": 4, "seed": 3}, dlrm(bags(8)), EBC


def _sample_batches():
    from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool
    from torchrec_dreamshard.evaluation.step_model import StepDLRM, StepModelSpec, sample_kjt
    from torchrec_dreamshard.planner.adapters.torchrec_adapter import table_wise_constraints

    tables = synthetic_pool(6, scale=CPU_POOL_SCALE, seed=3)
    batches = [sample_kjt(tables, 32, seed=s) for s in range(2)]
    kw = {
        "topology": cpu(2),
        "batch_size": 32,
        "sample_batches": batches,
        "constraints": table_wise_constraints(tables),
    }
    return kw, StepDLRM(StepModelSpec(bags=tables), META), EBC


def _nested_collections():
    class Towers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.user = torch.nn.ModuleDict(
                {"ebc": EmbeddingBagCollection(bags(3, prefix="u"), device=META)}
            )
            self.item = torch.nn.Sequential(EmbeddingBagCollection(bags(4), device=META))

    return {"topology": cpu(2)}, Towers(), EBC


def _error_table_wise_only_too_big():
    tables = bags(2) + [table("huge", 1_600_000, 16)]
    cons = {"huge": ParameterConstraints(sharding_types=["table_wise"])}
    return {"topology": cpu(2, ddr=80 * 2**20), "constraints": cons}, dlrm(tables), EBC


def _error_model_too_big():
    tables = bags(6, rows=50_000, dim=64)
    cons = {t.name: ParameterConstraints(sharding_types=["table_wise"]) for t in tables}
    return {"topology": cpu(2, ddr=100 * 2**20), "constraints": cons}, dlrm(tables), EBC


CASES: dict[str, Case] = {
    "dp_dear_bandwidth": _dp_dear_bandwidth,
    "gloo_like_w4": _gloo_like_w4,
    "cheap_collectives_w2": _cheap_collectives_w2,
    "constraints_bound_the_choice": _constraints_bound_the_choice,
    "forbid_table_wise": _forbid_table_wise,
    "forbid_table_wise_hosts": _forbid_table_wise_hosts,
    "split_too_big_min_partition": _split_too_big_min_partition,
    "split_too_big_default_width": _split_too_big_default_width,
    "split_hot_wide": _split_hot_wide,
    "memory_tight": _memory_tight,
    "memory_tighter": _memory_tighter,
    "memory_retry": _memory_retry,
    "user_proposer": _user_proposer,
    "user_proposer_with_types": _user_proposer_with_types,
    "user_enumerator": _user_enumerator,
    "user_partitioner_and_perf_model": _user_partitioner_and_perf_model,
    "sequences_dear": _sequences_dear,
    "sequences_gloo_like": _sequences_gloo_like,
    "hosts_cpu_hot": _hosts_cpu_hot,
    "hosts_cuda_hot": _hosts_cuda_hot,
    "hosts_cuda_many": _hosts_cuda_many,
    "hosts_mixed_w8_l4": _hosts_mixed(8, 4, comm(0.0, 10.0)),
    "hosts_mixed_w16_l8": _hosts_mixed(16, 8, comm(0.0, 10.0)),
    "hosts_mixed_w16_l2_gloo_like": _hosts_mixed(16, 2, None),
    "world_16": _world_16,
    "greedy_mode": _greedy_mode,
    "search_mode": _search_mode,
    "sample_batches": _sample_batches,
    "nested_collections": _nested_collections,
    "error_table_wise_only_too_big": _error_table_wise_only_too_big,
    "error_model_too_big": _error_model_too_big,
}


# -- planning and recording ---------------------------------------------------------------


def plan_record(agent, case: Case) -> dict:
    """What the planner decides for ``case``: every table's sharding, the predicted step
    and the winning proposer, or the error."""
    kw, model, sharders = case()
    kw = {"collectives": GLOO_LIKE, "dense_kernel": CPU_DENSE_LIKE, **kw}
    topology = kw.pop("topology")
    batch_size = kw.pop("batch_size", 64)
    planner = DreamShardPlanner(
        topology, batch_size, agent=agent, calibrate=False, debug=False, **kw
    )
    try:
        plan = planner.plan(model, sharders)
    except PlannerError as exc:
        return {"error": ["PlannerError", exc.error_type.name, str(exc)]}
    tables = {}
    for path, module_plan in sorted(plan.plan.items()):
        for name, ps in sorted(module_plan.items()):
            shards = ps.sharding_spec.shards if ps.sharding_spec is not None else []
            tables[f"{path}.{name}"] = {
                "type": ps.sharding_type,
                "kernel": ps.compute_kernel,
                "ranks": None if ps.ranks is None else [int(r) for r in ps.ranks],
                "shards": [
                    [list(map(int, m.shard_offsets)), list(map(int, m.shard_sizes))] for m in shards
                ],
            }
    pred = planner.last_prediction
    return {
        "tables": tables,
        "step_ms": None if pred is None else float(pred.step_ms),
        "winner": planner.proposal_log.winner,
    }


@pytest.fixture(scope="module")
def bundled():
    from torchrec_dreamshard.policy.checkpoint import load_checkpoint

    return load_checkpoint(None)


@pytest.fixture(scope="module")
def recorded():
    if RECORD:
        out: dict = {}
        yield out
        PATH.parent.mkdir(exist_ok=True)
        PATH.write_text(json.dumps(dict(sorted(out.items())), indent=1) + "\n")
        return
    if not PATH.exists():
        pytest.fail(f"{PATH} is missing: record it (see this module's docstring)")
    yield json.loads(PATH.read_text())


def partition(record: dict, topology: Topology) -> tuple:
    """``record``'s plan without the numbers of identical devices: each table's sharding
    type and kernel, and what every device holds (a table's shard: offsets and sizes),
    devices interchangeable within a host (``local_world_size`` ranks) of equal storage."""
    contents: dict[int, list] = {}
    for name, t in record["tables"].items():
        ranks, shards = t["ranks"] or [], t["shards"]
        held = shards if len(shards) == len(ranks) else [None] * len(ranks)  # replicated
        for rank, shard in zip(ranks, held, strict=True):
            contents.setdefault(rank, []).append((name, shard))
    world, local = topology.world_size, topology.local_world_size
    hosts = [list(range(h, min(h + local, world))) for h in range(0, world, local)]
    keys = {d.rank: (d.storage.hbm, d.storage.ddr) for d in topology.devices}
    types = sorted((name, t["type"], t["kernel"]) for name, t in record["tables"].items())
    return tuple(types), canonical_partition(contents, hosts, keys)


def golden_differences(want: dict, got: dict, topology: Topology) -> list[str]:
    """How ``got`` (a :func:`plan_record`) differs from the recorded ``want`` beyond a
    relabelling of identical devices or a tie (empty: it does not)."""
    if "error" in want or "error" in got:
        return [] if got == want else [f"{want.get('error')} -> {got.get('error')}"]
    found = plan_differences(
        (partition(want, topology), want["step_ms"]), (partition(got, topology), got["step_ms"])
    )
    if want["step_ms"] is None and got["winner"] != want["winner"]:
        found.append(f"winner {want['winner']} -> {got['winner']}")
    return found


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_planner_plans_as_recorded(name, bundled, recorded):
    got = plan_record(bundled, CASES[name])
    if RECORD:
        recorded[name] = got
        return
    want = recorded.get(name)
    assert want is not None, f"case {name!r} was never recorded"
    topology = CASES[name]()[0]["topology"]
    assert golden_differences(want, got, topology) == [], (want, got)


def test_a_relabelled_plan_passes_and_a_worse_plan_fails(bundled, recorded):
    """The comparison accepts the recorded plan with identical devices renumbered and
    rejects a plan the cost network predicts slower: the plan TorchRec's greedy proposer
    and partitioner make of ``split_hot_wide`` (chosen by TorchRec's no-op performance
    model, so that it, not the policy's plan, wins), priced by the same cost network."""
    if RECORD:
        return
    want = recorded["split_hot_wide"]
    kw, model, sharders = CASES["split_hot_wide"]()
    swap = {2: 3, 3: 2}  # ranks 2 and 3 of one host, equal memory
    relabelled = {
        **want,
        "tables": {
            n: {**t, "ranks": [swap.get(r, r) for r in t["ranks"]]}
            for n, t in want["tables"].items()
        },
    }
    assert relabelled["tables"] != want["tables"]
    assert golden_differences(want, relabelled, kw["topology"]) == []

    def worse_case():
        torchrecs = {
            "proposer": GreedyProposer(),
            "partitioner": GreedyPerfPartitioner(),
            "performance_model": NoopPerfModel(kw["topology"]),
        }
        return kw | torchrecs, model, sharders

    worse = plan_record(bundled, worse_case)
    assert worse["step_ms"] > want["step_ms"] * (1 + 10 * TIE_RTOL), worse
    found = golden_differences(want, worse, kw["topology"])
    assert len(found) == 1 and "another plan, not a tie" in found[0], found


def test_every_case_is_recorded(recorded):
    if not RECORD:
        assert sorted(recorded) == sorted(CASES)


def _types(recorded: dict, name: str) -> set[str]:
    return {t["type"] for t in recorded[name]["tables"].values()}


def test_the_cases_exercise_what_they_are_for(recorded):
    """The recorded plans hold what each case is there to exercise."""
    if RECORD:
        return
    assert "data_parallel" in _types(recorded, "dp_dear_bandwidth")
    assert _types(recorded, "cheap_collectives_w2") == {"table_wise"}
    for name in ("split_too_big_min_partition", "split_too_big_default_width", "split_hot_wide"):
        assert "column_wise" in _types(recorded, name), name
    assert {"row_wise", "table_row_wise", "data_parallel"} <= _types(
        recorded, "forbid_table_wise_hosts"
    )
    assert "table_row_wise" in _types(recorded, "hosts_cuda_hot")
    for name in ("hosts_mixed_w8_l4", "hosts_mixed_w16_l8"):
        assert {"table_wise", "table_row_wise", "data_parallel"} <= _types(recorded, name)
    assert recorded["sequences_dear"]["tables"]["ec.hist"]["type"] == "data_parallel"
    # a user's proposer can win (its plan rated better than DreamShard's); with the type
    # choice's table-wise balance by kernel and sent bytes, DreamShard's own typed plan
    # now rates better than GreedyProposer's in user_proposer_with_types
    assert recorded["user_partitioner_and_perf_model"]["winner"] == "GreedyProposer#0"
    assert recorded["user_proposer_with_types"]["winner"] == "DreamShardProposer"
    assert recorded["error_table_wise_only_too_big"]["error"][1] == "STRICT_CONSTRAINTS"
    assert recorded["error_model_too_big"]["error"][1] == "INSUFFICIENT_STORAGE"


def test_the_memory_case_re_runs_the_policy(bundled, monkeypatch):
    """``memory_retry`` makes the policy place more than once (TorchRec's storage estimate
    overflowed a device the first time)."""
    from torchrec_dreamshard.policy import DreamShard

    calls = []
    place = DreamShard.place
    monkeypatch.setattr(DreamShard, "place", lambda *a, **k: calls.append(1) or place(*a, **k))
    plan_record(bundled, CASES["memory_retry"])
    assert len(calls) >= 2
