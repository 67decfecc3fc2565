"""The sharding-type choice: which tables leave table-wise, by the typed cost model."""

from __future__ import annotations

import pytest
import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from torchrec_dreamshard.cost.collective_models import CollectiveModels
from torchrec_dreamshard.cost.comm_model import CommModel
from torchrec_dreamshard.measure.collective_timing import COLLECTIVES
from torchrec_dreamshard.planner import DreamShardPlanner
from torchrec_dreamshard.planner.adapters.torchrec_adapter import planner_best_plan
from torchrec_dreamshard.planner.type_choice.type_choice import TYPE_MARGIN, typed_step_ms
from torchrec_dreamshard.policy import DreamShard

META = torch.device("meta")


pytestmark = pytest.mark.usefixtures("quiet")


@pytest.fixture(scope="module")
def agent() -> DreamShard:
    from torchrec_dreamshard.policy.checkpoint import load_checkpoint

    return load_checkpoint(None)  # the bundled cost network: kernels priced as trained


def models(latency_ms: float, ms_per_mb: float) -> CollectiveModels:
    model = CommModel(latency_ms=latency_ms, per_peer_ms=0.0, ms_per_mb=ms_per_mb)
    return CollectiveModels(backend="test", models=dict.fromkeys(COLLECTIVES, model))


class Model(torch.nn.Module):
    def __init__(self, tables):
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=tables, device=META)


def tiny_and_big(n_tiny: int = 12) -> list[EmbeddingBagConfig]:
    tiny = [
        EmbeddingBagConfig(
            name=f"tiny{i}", embedding_dim=8, num_embeddings=50, feature_names=[f"a{i}"]
        )
        for i in range(n_tiny)
    ]
    big = [
        EmbeddingBagConfig(
            name=f"big{i}", embedding_dim=64, num_embeddings=200_000, feature_names=[f"b{i}"]
        )
        for i in range(4)
    ]
    return tiny + big


def plan_types(agent, collectives, world=4, **kw):
    topo = kw.pop("topology", None) or Topology(world_size=world, compute_device="cpu")
    p = DreamShardPlanner(topo, 512, agent=agent, debug=False, collectives=collectives, **kw)
    plan = p.plan(
        Model(kw.pop("tables", None) or tiny_and_big()), [EmbeddingBagCollectionSharder()]
    )
    return p, {name: ps.sharding_type for name, ps in plan.plan["ebc"].items()}


def test_dear_bandwidth_replicates_tiny_tables_only(agent):
    """All-to-all bytes dear (100 ms per MB): the tiny tables are cheaper replicated than
    sent; the big ones (an all-reduce of their 51 MB) stay table-wise."""
    p, types = plan_types(agent, models(0.0, 100.0))
    assert {types[f"tiny{i}"] for i in range(12)} == {"data_parallel"}
    assert {types[f"big{i}"] for i in range(4)} == {"table_wise"}
    chosen = p.proposer.last_types
    assert chosen.step_ms < chosen.table_wise_ms * (1 - TYPE_MARGIN)
    # the plan as planned, rated again from its options, is what the choice predicted
    again = typed_step_ms(planner_best_plan(p), p.proposer.type_chooser, p.table_specs)
    assert again == pytest.approx(chosen.step_ms, rel=0.15)


def test_cheap_collectives_keep_everything_table_wise(agent):
    p, types = plan_types(agent, models(0.0, 0.0))
    assert set(types.values()) == {"table_wise"}
    assert p.proposer.last_types.moved == {}


def test_constraints_bound_the_choice(agent):
    cons = {f"tiny{i}": ParameterConstraints(sharding_types=["table_wise"]) for i in range(6)}
    _, types = plan_types(agent, models(0.0, 100.0), constraints=cons)
    assert {types[f"tiny{i}"] for i in range(6)} == {"table_wise"}
    assert {types[f"tiny{i}"] for i in range(6, 12)} == {"data_parallel"}


@pytest.mark.parametrize("local", [8, 4, 2])
def test_across_hosts_a_hot_table_is_spread(agent, local):
    """16 GPUs in hosts of 8, 4 or 2, a slow network between them (analytic, unmeasured
    here): the hottest tables leave table-wise for row-wise or table-row-wise, and a
    table-row-wise table's shards stay on one host's ranks; TorchRec's validations pass
    on the plan."""
    hot = [
        EmbeddingBagConfig(
            name=f"hot{i}", embedding_dim=128, num_embeddings=2_000_000, feature_names=[f"h{i}"]
        )
        for i in range(2)
    ]
    cons = {f"hot{i}": ParameterConstraints(pooling_factors=[200.0]) for i in range(2)}
    topo = Topology(
        world_size=16, local_world_size=local, compute_device="cuda", hbm_cap=32 * 2**30
    )
    p = DreamShardPlanner(topo, 512, agent=agent, debug=False, constraints=cons)
    plan = p.plan(Model(hot + tiny_and_big(4)), get_default_sharders())
    types = {n: ps.sharding_type for n, ps in plan.plan["ebc"].items()}
    assert {types["hot0"], types["hot1"]} <= {"row_wise", "table_row_wise"}, types
    for ps in plan.plan["ebc"].values():
        if ps.sharding_type == "table_row_wise":
            assert len(ps.ranks) == local and len({r // local for r in ps.ranks}) == 1, ps.ranks


class WithSequences(torch.nn.Module):
    def __init__(self, bags, sequences):
        from torchrec.modules.embedding_modules import EmbeddingCollection

        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=bags, device=META)
        self.ec = EmbeddingCollection(tables=sequences, device=META)


def plan_with_sequence(agent, device: str, sharding_types: list[str] | None = None):
    """A planner and its plan of two tiny and four big bags beside ``ec.hist``, a small
    sequence table of 30 ids per sample, with dear bytes (100 ms per MB)."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.modules.embedding_configs import EmbeddingConfig

    seq = [EmbeddingConfig(name="hist", embedding_dim=16, num_embeddings=200, feature_names=["h"])]
    cons = {"hist": ParameterConstraints(pooling_factors=[30.0], sharding_types=sharding_types)}
    topo = Topology(world_size=4, compute_device=device)
    p = DreamShardPlanner(
        topo, 512, agent=agent, debug=False, constraints=cons, collectives=models(0.0, 100.0)
    )
    sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    return p, p.plan(WithSequences(tiny_and_big(2), seq), sharders)


def test_sequence_tables_join_the_choice_as_sequence_lookups(agent):
    """A small sequence table of 30 ids per sample: its all-to-all carries 30 rows per
    sample, so with dear bytes it is cheaper replicated; it is rated unpooled."""
    from torchrec_dreamshard.planner.type_choice.type_choice import typed_choices

    p, plan = plan_with_sequence(agent, "cuda")
    assert plan.plan["ec"]["hist"].sharding_type == "data_parallel"
    assert "ec.hist" in p.proposer.last_types.moved
    rated = {c.table.name: c for c in typed_choices(planner_best_plan(p), p.table_specs)}
    assert rated["ec.hist"].pooled is False and rated["ebc.big0"].pooled is True


def test_no_data_parallel_sequence_table_on_cpu(agent):
    """On CPU ranks a data-parallel EmbeddingCollection does not run (FBGEMM's CPU dense
    kernel pools its lookups, and the collection's forward cannot split them by the ids'
    lengths): the same table, cheaper replicated, is not offered data-parallel there, and
    a table constrained to it alone is refused, naming it."""
    _, plan = plan_with_sequence(agent, "cpu")
    assert plan.plan["ec"]["hist"].sharding_type != "data_parallel"
    with pytest.raises(ValueError, match="'hist'.*data_parallel.*CPU"):
        plan_with_sequence(agent, "cpu", ["data_parallel"])


def fitted(latency_ms: float, ms_per_mb: float, rmse_ms: float) -> CollectiveModels:
    """Collective models as if fitted on 12 timings each, with this fit error."""
    model = CommModel(
        latency_ms=latency_ms, per_peer_ms=0.0, ms_per_mb=ms_per_mb, samples=12, rmse_ms=rmse_ms
    )
    return CollectiveModels(backend="test", models=dict.fromkeys(COLLECTIVES, model))


def test_a_clear_decision_keeps_its_type_and_says_what_tipped_it(agent):
    """Dear all-to-all bytes, fitted with a small error: replicating the tiny tables wins
    by far more than its margin, is kept, and the decision names the all-to-all."""
    from torchrec_dreamshard.planner.type_choice.type_choice import Z_SCORE

    p, types = plan_types(agent, fitted(0.0, 100.0, rmse_ms=0.01))
    assert {types[f"tiny{i}"] for i in range(12)} == {"data_parallel"}
    chosen = p.proposer.last_types
    dp = [d for d in chosen.decisions if d.kind == "data_parallel"]
    assert len(dp) == 1 and dp[0].kept
    d = dp[0]
    assert d.gain_ms > d.margin_ms >= Z_SCORE * d.uncertainty_ms > 0
    assert d.gain_ms == pytest.approx(chosen.table_wise_ms - chosen.step_ms)
    assert sum(d.contributions.values()) == pytest.approx(d.gain_ms, rel=1e-6)
    assert d.tipped_by[0] == "all_to_all" and d.tipped_by[1] > 0
    record = p.adaptation["types"]
    assert record["decisions"][0]["tipped_by"] == "all_to_all"
    assert set(record["moved"].values()) == {"data_parallel"}


def test_a_contested_decision_falls_back_to_table_wise(agent):
    """The same models, but the collectives fitted with an error larger than what
    replicating gains: the choice is within the uncertainty, so every table stays
    table-wise, and the decision says the uncertainty of a collective tipped it."""
    clear, _ = plan_types(agent, fitted(0.0, 100.0, rmse_ms=0.01))
    gain = clear.proposer.last_types.decisions[0].gain_ms
    p, types = plan_types(agent, fitted(0.0, 100.0, rmse_ms=gain))
    assert set(types.values()) == {"table_wise"}
    chosen = p.proposer.last_types
    assert chosen.moved == {} and chosen.step_ms == chosen.table_wise_ms
    d = next(d for d in chosen.decisions if d.kind == "data_parallel")
    assert not d.kept and 0 < d.gain_ms <= d.margin_ms
    assert d.gain_ms == pytest.approx(gain, rel=1e-6)  # the same prediction, a wider margin
    assert d.tipped_by[0].startswith("uncertainty of ")
    assert "contested" in "\n".join(chosen.lines())


def test_the_breakdown_by_source_adds_up_to_the_plan_cost(agent):
    """The margin splits a plan's cost by source; the parts sum to ``plan_cost``'s ranks."""
    from torchrec_dreamshard.cost.plans import plan_breakdown, plan_cost
    from torchrec_dreamshard.cost.sharding import TableChoice

    p, _ = plan_types(agent, models(0.0, 100.0))
    ctx = p.proposer.type_chooser.ctx
    specs = [p.table_specs(o) for o in planner_best_plan(p)]
    choices = [
        TableChoice(table=s, sharding_type="data_parallel")
        if "tiny" in s.name
        else TableChoice(table=s, sharding_type="table_wise", ranks=(k % 4,))
        for k, s in enumerate(specs)
    ]
    parts = plan_breakdown(choices, ctx)
    whole = plan_cost(choices, ctx)
    assert parts.total_ms == pytest.approx([r.total_ms for r in whole.ranks], rel=1e-9)
    assert parts.dense_ms.min() > 0 and set(parts.comm_ms) >= {"all_to_all", "all_reduce"}


# --- at scale: the pieces that keep the choice fast --------------------------------------


@pytest.mark.parametrize(("world", "local"), [(16, 4), (10, 4), (8, 8), (12, 2)])
def test_flow_totals_are_the_flow_matrix_summed(world, local):
    """An all-to-all priced from its per-rank totals costs what it costs from its ``[W, W]``
    flows, hosts of unequal size included; so do the one-to-all and cross-host shortcuts."""
    import numpy as np

    from torchrec_dreamshard.cost.comm_topology import (
        CommTopology,
        FlowTotals,
        all_to_all_ms,
        analytic_models,
    )
    from torchrec_dreamshard.cost.sharding_types.table_row_wise import cross_host_totals

    topo = CommTopology(world_size=world, local_world_size=local, inter_host_bw=1e6)
    rng = np.random.default_rng(world)
    flows = rng.random((world, world)) * 1e6
    models = analytic_models(topo)
    every = range(world)
    totals = FlowTotals.from_matrix(topo, flows)
    assert all_to_all_ms(topo, models, every, totals) == pytest.approx(
        all_to_all_ms(topo, models, every, flows)
    )
    u, v = rng.random(world), rng.random(world)
    outer = FlowTotals.outer(topo, u, v)
    for name in FlowTotals.FIELDS:
        assert getattr(outer, name) == pytest.approx(
            getattr(FlowTotals.from_matrix(topo, np.outer(u, v)), name)
        )
    for rank in range(world):
        one = FlowTotals.one_to_all(topo, rank, 3.0)
        dense = np.zeros((world, world))
        dense[rank, :] = 3.0
        ref = FlowTotals.from_matrix(topo, dense)
        for name in FlowTotals.FIELDS:
            assert getattr(one, name) == pytest.approx(getattr(ref, name)), (rank, name)
    host = topo.host_ranks(topo.num_hosts - 1)
    cross = cross_host_totals(topo, host, 5.0)
    dense = np.zeros((world, world))
    local_idx = np.arange(world) % local
    for r in host:
        peers = (local_idx == r % local) & topo.remote_mask()[r]
        dense[r, peers] = 5.0
    ref = FlowTotals.from_matrix(topo, dense)
    for name in FlowTotals.FIELDS:
        assert getattr(cross, name) == pytest.approx(getattr(ref, name)), name


def test_offers_are_pruned_by_the_strategies_on_large_models(agent):
    """On a large model data-parallel is offered only to a table whose all-reduce moves
    less than its outputs (a small table, not a big one), row-wise only to a table heavy
    enough to load a device, table-row-wise to every table; a small model is offered
    every type."""
    from torchrec_dreamshard.cost.comm_topology import CommTopology
    from torchrec_dreamshard.cost.sharding import OfferScope
    from torchrec_dreamshard.cost.sharding_types import STRATEGIES
    from torchrec_dreamshard.data.tables import TableSpec
    from torchrec_dreamshard.planner.type_choice.type_offers import offered_types

    topo = CommTopology(world_size=128, local_world_size=8)
    scope = OfferScope(topology=topo, local_batch=8192.0, mean_lookups=800.0)
    small = TableSpec(name="small", rows=10_000, dim=64, pooling_factor=1.0)
    big = TableSpec(name="big", rows=10_000_000, dim=64, pooling_factor=1.0)
    wide = TableSpec(name="wide", rows=1000, dim=256, pooling_factor=1.0)
    dp, rw, twrw = (STRATEGIES[k] for k in ("data_parallel", "row_wise", "table_row_wise"))
    assert dp.may_gain(small, True, scope) and not dp.may_gain(big, True, scope)
    assert rw.may_gain(wide, True, scope) and not rw.may_gain(small, True, scope)
    assert all(twrw.may_gain(t, True, scope) for t in (small, big, wide))
    loose = OfferScope(topology=topo, local_batch=8192.0, mean_lookups=800.0, prune=False)
    assert dp.may_gain(big, True, loose) and rw.may_gain(small, True, loose)

    topology = Topology(world_size=16, local_world_size=4, compute_device="cuda")
    offers = offered_types(Model(tiny_and_big(4)), topology, 512)
    every = {"data_parallel", "row_wise", "table_row_wise"}
    assert all(set(o) == every for o in offers.values()), offers


def test_screening_rates_candidates_as_the_full_rating_does(agent, monkeypatch):
    """The fast screening (per-rank sums, table-wise parts relabelled from rank 0) rates
    every candidate the sweep tries as the screening of the whole plan's terms does,
    on hosts of 4 (the relabelling) and on hosts of unequal size (none: each choice
    reduced)."""
    from torchrec_dreamshard.planner.type_choice import type_choice
    from torchrec_dreamshard.planner.type_choice.type_screening import ScreeningRater

    seen = []

    class Checked(ScreeningRater):
        def __call__(self, moved):
            fast = super().__call__(moved)
            seen.append((fast, self.rater(moved)))
            return fast

    monkeypatch.setattr(type_choice, "ScreeningRater", Checked)
    many = [
        EmbeddingBagConfig(
            name=f"m{i}",
            embedding_dim=16 * (1 + i % 4),
            num_embeddings=1000 * (1 + i),
            feature_names=[f"m{i}"],
        )
        for i in range(40)
    ]
    for world, local in ((8, 4), (10, 4)):
        topo = Topology(world_size=world, local_world_size=local, compute_device="cuda")
        p = DreamShardPlanner(topo, 512, agent=agent, debug=False)
        p.plan(Model(many + tiny_and_big(4)), get_default_sharders())
    assert len(seen) > 10
    for fast, full in seen:
        assert fast == pytest.approx(full, rel=1e-9)


def test_the_summary_explains_the_plan_per_type(agent):
    """The chosen plan per type: every table counted once, the types' shares of the
    slowest rank add up to its predicted step, inter-host bytes reported; the stats rows
    say it."""
    from torchrec_dreamshard.planner.stages.stats import type_choice_lines

    p, types = plan_types(agent, models(0.0, 100.0))
    summary = p.proposer.last_types.summary
    assert sum(summary.tables.values()) == len(types)
    assert summary.tables.get("data_parallel", 0) == sum(
        t == "data_parallel" for t in types.values()
    )
    assert sum(summary.share_ms.values()) == pytest.approx(summary.step_ms, rel=1e-6)
    assert summary.step_ms == pytest.approx(p.proposer.last_types.step_ms, rel=1e-6)
    rows = type_choice_lines(p.adaptation["types"])
    assert any("slowest rank" in r and "inter-host traffic" in r for r in rows), rows
