"""The per-sharding-type cost terms and the cost of a typed plan.

The rules of thumb are checked on a fixed, gloo-like set of collective models and a
physical kernel stub (time linear in elements gathered and bags), never hard-coded.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from torchrec_dreamshard.cost.collective_models import CollectiveModels
from torchrec_dreamshard.cost.comm_model import CommModel
from torchrec_dreamshard.cost.comm_topology import CommTopology
from torchrec_dreamshard.cost.plans import cost_network_kernel, plan_cost, table_cost
from torchrec_dreamshard.cost.sharding import CostContext, TableChoice
from torchrec_dreamshard.cost.sharding_types.row_wise import routed_share
from torchrec_dreamshard.data.tables import NUM_REUSE_BINS, TableSpec
from torchrec_dreamshard.measure.collective_timing import COLLECTIVES

# Close to what gloo on 4 ranks of this 2-core machine gave (ms, ms per peer, ms per MB).
GLOO_LIKE = {
    "all_to_all": (0.2, 0.9, 0.8),
    "reduce_scatter": (0.2, 2.3, 2.5),
    "all_gather": (0.2, 2.5, 1.3),
    "all_reduce": (0.2, 2.4, 0.5),
}


def models_from(coefs: dict[str, tuple[float, float, float]]) -> CollectiveModels:
    return CollectiveModels(
        backend="test", models={k: CommModel(*v, source="test") for k, v in coefs.items()}
    )


GLOO = models_from(GLOO_LIKE)
BANDWIDTH_ONLY = models_from(dict.fromkeys(COLLECTIVES, (0.0, 0.0, 1.0)))
LATENCY_ONLY = models_from(dict.fromkeys(COLLECTIVES, (1.0, 0.5, 0.0)))


class KernelStub:
    """A physical kernel: 1 ns per element gathered, 20 ns per bag, 50 us per call;
    backward twice the forward. Records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[TableSpec], int]] = []

    def __call__(self, tables: list[TableSpec], batch: int) -> tuple[float, float]:
        self.calls.append((list(tables), batch))
        fwd = 0.05 + sum(batch * t.pooling_factor * t.dim * 1e-6 + batch * 2e-5 for t in tables)
        return fwd, 2 * fwd


def ctx_for(world: int, local: int | None = None, models=GLOO, batch: int = 8192, **kw):
    topo = CommTopology(world_size=world, local_world_size=local)
    return CostContext(
        batch_size=batch, topology=topo, collectives=models, kernel_ms=KernelStub(), **kw
    )


def step(choice: TableChoice, ctx: CostContext) -> float:
    return table_cost(choice, ctx).step_ms


def hot_hist() -> tuple[float, ...]:
    """Most accessed rows read once, a few read more than 2^15 times."""
    h = [0.0] * NUM_REUSE_BINS
    h[0], h[-1] = 0.999, 0.001
    return tuple(h)


TINY = TableSpec(name="tiny", rows=100, dim=8, pooling_factor=1.0)
MID = TableSpec(name="mid", rows=100_000, dim=64, pooling_factor=4.0)
HUGE_HOT = TableSpec(
    name="huge", rows=20_000_000, dim=128, pooling_factor=80.0, reuse_hist=hot_hist()
)


def test_a_tiny_table_is_cheaper_data_parallel_but_a_mid_one_is_not():
    ctx = ctx_for(4)
    for table, dp_wins in ((TINY, True), (MID, False)):
        dp = step(TableChoice(table=table, sharding_type="data_parallel"), ctx)
        tw = step(TableChoice(table=table, sharding_type="table_wise", ranks=(0,)), ctx)
        assert (dp < tw) == dp_wins, (table.name, dp, tw)


def test_dp_joins_the_dense_all_reduce_the_job_runs_anyway():
    alone = ctx_for(4, models=LATENCY_ONLY)
    shared = ctx_for(4, models=LATENCY_ONLY, dense_grad_bytes=1e6)
    choice = TableChoice(table=TINY, sharding_type="data_parallel")
    dp_comm = table_cost(choice, alone).ranks[0].comm_ms
    assert dp_comm == pytest.approx(1.0 + 0.5 * 3)  # one all-reduce's latency
    assert table_cost(choice, shared).ranks[0].comm_ms == pytest.approx(dp_comm)


@pytest.mark.parametrize("world", [4, 8])
def test_a_huge_hot_table_spreads_cheaper_row_wise(world):
    ctx = ctx_for(world)
    rw = table_cost(TableChoice(table=HUGE_HOT, sharding_type="row_wise"), ctx)
    tw = table_cost(TableChoice(table=HUGE_HOT, sharding_type="table_wise", ranks=(0,)), ctx)
    dp = table_cost(TableChoice(table=HUGE_HOT, sharding_type="data_parallel"), ctx)
    assert rw.step_ms < tw.step_ms < dp.step_ms
    share = routed_share(HUGE_HOT, ctx.batch_size, world)
    assert 1 / world < share < 1.0
    assert rw.ranks[0].fwd_ms < tw.ranks[0].fwd_ms * (share + 0.01)


def test_routed_share_is_even_for_uniform_access_and_skewed_for_hot_rows():
    uniform = TableSpec(name="u", rows=10**11, dim=8, pooling_factor=10.0)
    excess = routed_share(uniform, 8192, 4) - 0.25
    assert 0 < excess < 0.01
    # the busiest shard's excess shrinks as one over the root of the ids
    assert routed_share(uniform, 16 * 8192, 4) - 0.25 == pytest.approx(excess / 4, rel=0.02)
    assert routed_share(HUGE_HOT, 8192, 4) > 0.3
    assert routed_share(HUGE_HOT, 8192, 1) == 1.0


def test_sequence_outputs_scale_with_ids_times_dim():
    ctx = ctx_for(4, models=BANDWIDTH_ONLY, input_dist=False)

    def comm(pooling: float, dim: int, pooled: bool) -> float:
        t = TableSpec(name="s", rows=1000, dim=dim, pooling_factor=pooling)
        choice = TableChoice(table=t, sharding_type="table_wise", ranks=(0,), pooled=pooled)
        return table_cost(choice, ctx).ranks[0].comm_ms

    assert comm(20.0, 16, False) == pytest.approx(2 * comm(10.0, 16, False))
    assert comm(10.0, 32, False) == pytest.approx(2 * comm(10.0, 16, False))
    assert comm(10.0, 16, False) == pytest.approx(comm(1.0, 160, True))
    assert comm(20.0, 16, True) == pytest.approx(comm(10.0, 16, True))
    seq = TableSpec(name="s", rows=1000, dim=16, pooling_factor=10.0)
    table_cost(TableChoice(table=seq, sharding_type="row_wise", pooled=False), ctx)
    (tables, bags), *_ = ctx.kernel_ms.calls[-4:]
    assert bags == pytest.approx(8192 * 10.0 * routed_share(seq, 8192, 4), abs=1)
    assert tables[0].pooling_factor == 1.0 and tables[0].rows == 250


def test_a_table_wise_plan_pays_more_across_hosts_the_wider_its_outputs():
    def extra(dim: int) -> float:
        t = TableSpec(name="t", rows=1000, dim=dim, pooling_factor=2.0)
        choice = TableChoice(table=t, sharding_type="table_wise", ranks=(0,))
        return step(choice, ctx_for(8, 4)) - step(choice, ctx_for(8, 8))

    assert 0 < extra(16) < extra(256)


# -- consistency ----------------------------------------------------------------------------


def test_table_wise_without_input_dist_is_todays_all_to_all_model():
    a2a = CommModel(latency_ms=0.3, per_peer_ms=0.2, ms_per_mb=0.7)
    models = CollectiveModels(backend="test", models=dict.fromkeys(COLLECTIVES, a2a))
    ctx = ctx_for(3, models=models, batch=3000, input_dist=False)
    dims = [64, 0, 24]
    tables = [
        TableSpec(name=name, rows=99, dim=dim, pooling_factor=2.0)
        for name, dim in (("a", 40), ("b", 24), ("c", 24))
    ]
    choices = [
        TableChoice(table=t, sharding_type="table_wise", ranks=(r,))
        for t, r in zip(tables, (0, 0, 2), strict=True)
    ]
    got = [r.comm_ms for r in plan_cost(choices, ctx).ranks]
    assert got == pytest.approx(a2a.device_comm_ms(dims, 3000))


def test_collectives_of_several_tables_are_batched():
    ctx = ctx_for(4, models=LATENCY_ONLY)
    a = TableChoice(table=TINY, sharding_type="table_wise", ranks=(0,))
    b = TableChoice(table=MID, sharding_type="table_wise", ranks=(1,))
    one = table_cost(a, ctx).ranks[2].comm_ms
    assert one == pytest.approx(3 * (1.0 + 0.5 * 3))  # input, output fwd and bwd
    assert plan_cost([a, b], ctx).ranks[2].comm_ms == pytest.approx(one)
    dps = [TableChoice(table=t, sharding_type="data_parallel") for t in (TINY, MID)]
    assert plan_cost(dps, ctx).ranks[0].comm_ms == pytest.approx(1.0 + 0.5 * 3)
    kernels = ctx.kernel_ms
    kernels.calls.clear()
    plan_cost([a, TableChoice(table=MID, sharding_type="table_wise", ranks=(0,))], ctx)
    assert [len(t) for t, _ in kernels.calls] == [2]  # one fused kernel on rank 0


def test_table_row_wise_on_one_host_is_row_wise():
    ctx = ctx_for(4)
    rw = table_cost(TableChoice(table=HUGE_HOT, sharding_type="row_wise"), ctx)
    twrw = table_cost(
        TableChoice(table=HUGE_HOT, sharding_type="table_row_wise", ranks=(0, 1, 2, 3)), ctx
    )
    flat = [[r.fwd_ms, r.bwd_ms, r.comm_ms] for r in rw.ranks]
    assert [[r.fwd_ms, r.bwd_ms, r.comm_ms] for r in twrw.ranks] == flat


def test_table_row_wise_stays_in_its_host_until_the_cross_host_exchange():
    ctx = ctx_for(8, 4, models=BANDWIDTH_ONLY)

    def costs(dim: int) -> list:
        t = TableSpec(name="t", rows=100_000, dim=dim, pooling_factor=4.0)
        choice = TableChoice(table=t, sharding_type="table_row_wise", ranks=(4, 5, 6, 7))
        return table_cost(choice, ctx).ranks

    narrow, wide = costs(64), costs(128)
    assert [r.fwd_ms for r in wide[:4]] == [0.0] * 4 and min(r.fwd_ms for r in wide[4:]) > 0
    # Rank 0 (host 0) receives its samples' sums from rank 4 (host 1) and sends their
    # gradients back: the 64 extra columns cost it two all-to-alls of b * 64 * 4 bytes,
    # each at 1 ms per MB plus those bytes over the inter-host link.
    extra = 1024 * 64 * 4
    expected = 2 * (extra / 1e6 + extra / ctx.topology.inter_host_bw)
    assert wide[0].comm_ms - narrow[0].comm_ms == pytest.approx(expected)


def test_column_wise_splits_the_dim_over_its_ranks():
    ctx = ctx_for(4, models=BANDWIDTH_ONLY)
    cw = table_cost(TableChoice(table=MID, sharding_type="column_wise", ranks=(0, 1)), ctx)
    tw = table_cost(TableChoice(table=MID, sharding_type="table_wise", ranks=(0,)), ctx)
    assert cw.ranks[0].fwd_ms == pytest.approx(cw.ranks[1].fwd_ms)
    assert 0 < cw.ranks[0].fwd_ms < tw.ranks[0].fwd_ms
    assert cw.ranks[2].fwd_ms == 0.0


@pytest.mark.parametrize(
    ("choice", "match"),
    [
        (TableChoice(table=TINY, sharding_type="grid"), "unknown sharding type 'grid'"),
        (TableChoice(table=TINY, sharding_type="table_wise", ranks=(0, 1)), "exactly one rank"),
        (TableChoice(table=TINY, sharding_type="table_wise", ranks=(9,)), "rank 9 is out of range"),
        (TableChoice(table=TINY, sharding_type="row_wise", ranks=(0, 1)), "spans every rank"),
        (TableChoice(table=TINY, sharding_type="table_row_wise", ranks=(1, 2)), "one host's ranks"),
        (
            TableChoice(table=TINY, sharding_type="table_row_wise", ranks=(0, 1), pooled=False),
            "sequence table cannot be table_row_wise",
        ),
    ],
)
def test_bad_choices_name_the_table_and_what_is_right(choice, match):
    with pytest.raises(ValueError, match=match):
        table_cost(choice, ctx_for(4, 2))


def test_a_plan_names_tables_chosen_twice():
    a = TableChoice(table=TINY, sharding_type="data_parallel")
    with pytest.raises(ValueError, match="'tiny'\\] are chosen more than once"):
        plan_cost([a, a], ctx_for(2))


def test_cost_network_kernel_prices_fused_tables():
    from torchrec_dreamshard.policy import DreamShard

    kernel = cost_network_kernel(DreamShard.untrained(seed=0))
    f1, b1 = kernel([MID], 2048)
    f2, b2 = kernel([MID, TableSpec(name="m2", rows=100_000, dim=64, pooling_factor=4.0)], 2048)
    assert 0 < f1 <= f2 and 0 < b1 <= b2
    assert all(math.isfinite(x) for x in (f1, b1, f2, b2))


# -- the registry: a sharding type's cost is one strategy and its registration -------------


@pytest.fixture
def registry():
    """The cost strategies' registry, restored after the test."""
    from torchrec_dreamshard.cost import sharding_types

    live = (sharding_types.STRATEGIES, sharding_types.BY_TORCHREC_TYPE)
    saved = [dict(d) for d in live]
    yield sharding_types
    for d, old in zip(live, saved, strict=True):
        d.clear()
        d.update(old)


def test_every_type_has_one_registered_strategy(registry):
    assert registry.sharding_types() == (
        "data_parallel",
        "table_wise",
        "column_wise",
        "row_wise",
        "table_row_wise",
    )
    assert "table_row_wise" not in registry.sequence_types()
    assert registry.BY_TORCHREC_TYPE["table_column_wise"] is registry.STRATEGIES["column_wise"]
    assert registry.alternative_kernels() == {
        "data_parallel": "dense",
        "row_wise": "fused",
        "table_row_wise": "fused",
    }
    with pytest.raises(ValueError, match="already have a cost strategy"):
        registry.register(registry.STRATEGIES["row_wise"])


def test_a_new_type_is_one_strategy_and_its_registration(registry):
    """TorchRec's grid sharding (column shards, each row-wise within one host) priced by a
    strategy of a few lines: once registered, choices of it are checked by its rank rule
    and priced by the plan costing, placed options of it are read by the type choice's
    ``typed_choices``, and the type choice offers it on its kernel."""
    from types import SimpleNamespace

    from torchrec_dreamshard.cost.sharding import ShardingCost, Terms
    from torchrec_dreamshard.cost.sharding_types.column_wise import column_dims
    from torchrec_dreamshard.cost.sharding_types.table_row_wise import TableRowWise
    from torchrec_dreamshard.planner.type_choice.type_choice import alternatives, typed_choices

    class GridShard(ShardingCost):
        name = "grid_shard"
        alternative_kernel = "fused"

        def terms(self, choice, ctx):
            terms, host = Terms(), TableRowWise()
            for k, d in enumerate(column_dims(choice.table.dim, 2)):
                shard = dataclasses.replace(choice.table, name=f"{choice.table.name}/g{k}", dim=d)
                terms += host.terms(dataclasses.replace(choice, table=shard), ctx)
            return terms

        def check_ranks(self, choice, topo):
            return TableRowWise().check_ranks(choice, topo)

        def candidate_key(self, table, single_ms):
            return (-single_ms,)

    ctx = ctx_for(8, 4)
    grid = TableChoice(table=HUGE_HOT, sharding_type="grid_shard", ranks=(4, 5, 6, 7))
    with pytest.raises(ValueError, match="unknown sharding type 'grid_shard'"):
        table_cost(grid, ctx)
    registry.register(GridShard())
    cost = table_cost(grid, ctx)
    assert [r.fwd_ms for r in cost.ranks[:4]] == [0.0] * 4 and cost.ranks[4].fwd_ms > 0
    with pytest.raises(ValueError, match="one host's ranks"):
        table_cost(dataclasses.replace(grid, ranks=(3, 4)), ctx)
    shards = [SimpleNamespace(rank=r) for r in (4, 5, 6, 7)]
    option = SimpleNamespace(
        fqn="ebc.t", sharding_type="grid_shard", compute_kernel="fused", is_pooled=True
    )
    option.shards = shards
    (typed,) = typed_choices([option], lambda o: HUGE_HOT)
    assert typed == grid
    assert alternatives([option], {"ebc.t"}) == {"ebc.t": {"grid_shard": option}}
