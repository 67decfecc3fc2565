"""Row-wise: the rows are split over every rank and ids are routed to their owner.

Each rank holds ``ceil(R / W)`` rows and looks up ``B p s`` ids over ``B`` bags, ``s`` the
busiest rank's share (:func:`routed_share`). Pooled: a reduce-scatter of ``S = B d o``
forward, an all-gather backward. Sequence: an all-to-all ``F[j, i] = b p d o / W`` and
back. Offered on the fused kernel, hottest tables first.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from torchrec_dreamshard.cost.comm_topology import FlowTotals
from torchrec_dreamshard.cost.physics import mean_access_count
from torchrec_dreamshard.cost.sharding import (
    OUTPUT_BYTES,
    CostContext,
    Exchange,
    KernelCall,
    OfferScope,
    SpansEveryRank,
    TableChoice,
    Terms,
    both_ways,
    kernel_group,
    kernel_view,
    output_width_bytes,
)
from torchrec_dreamshard.cost.sharding_types.table_wise import input_totals
from torchrec_dreamshard.data.tables import BIN_HIGH, BIN_LOW, TableSpec

ROW_SPLIT_SHARE = 0.25  # of the mean device's lookups: below it, row-wise is not offered


class RowWise(SpansEveryRank):
    name = "row_wise"
    alternative_kernel = "fused"

    def terms(self, choice: TableChoice, ctx: CostContext) -> Terms:
        t, every = choice.table, ctx.every_rank
        terms = row_shard_terms(choice, ctx, every)
        if choice.pooled:
            partial = ctx.batch_size * t.dim * OUTPUT_BYTES
            return terms + Terms(
                exchanges=(
                    Exchange("row_wise/out/fwd", "reduce_scatter", every, buffer_bytes=partial),
                    Exchange("row_wise/out/bwd", "all_gather", every, buffer_bytes=partial),
                )
            )
        rows_back = ctx.local_batch * output_width_bytes(t, t.dim, False) / len(every)
        ones = np.ones(ctx.topology.world_size)
        flows = FlowTotals.outer(ctx.topology, ones * rows_back, ones)
        return terms + Terms(exchanges=both_ways("row_wise/out", every, flows))  # type: ignore[arg-type]

    def candidate_key(self, table: TableSpec, single_ms: float) -> tuple[float, ...]:
        return (-single_ms,)

    def may_gain(self, table: TableSpec, pooled: bool, scope: OfferScope) -> bool:
        """A pruning rule, not a bound: offered only to a table whose ``p d`` is at least
        :data:`ROW_SPLIT_SHARE` of the mean device's lookups."""
        if not scope.prune:
            return True
        return table.pooling_factor * table.dim >= ROW_SPLIT_SHARE * scope.mean_lookups


def routed_share(table: TableSpec, batch_size: int, num_shards: int) -> float:
    """The busiest of ``num_shards`` row shards' expected share of the table's ids.

    With ``U = L / m`` accessed rows (``L = B p`` ids) hashed to ``n`` shards, a share has mean
    ``1 / n`` and ``sigma = sqrt((n - 1) U E[c^2]) / (n L)``; the busiest is about
    ``1 / n + sigma sqrt(2 ln n)``, at most 1.
    """
    n = num_shards
    if n <= 1:
        return 1.0
    lookups = batch_size * table.pooling_factor
    hist = table.hist(batch_size)
    mean_sq = float(np.dot(hist, (BIN_LOW**2 + BIN_LOW * BIN_HIGH + BIN_HIGH**2) / 3.0))
    sigma = math.sqrt((n - 1) * lookups / mean_access_count(hist) * mean_sq) / (n * lookups)
    return min(1.0, 1.0 / n + sigma * math.sqrt(2.0 * math.log(n)))


def row_shard_terms(choice: TableChoice, ctx: CostContext, ranks: tuple[int, ...]) -> Terms:
    """The shard kernels and the input all-to-all of a table split by rows over ``ranks``."""
    t, n = choice.table, len(ranks)
    share = routed_share(t, ctx.batch_size, n) if ctx.skew else 1.0 / n
    shard = replace(
        t, name=f"{t.name}/rw", rows=-(-t.rows // n), pooling_factor=t.pooling_factor * share
    )
    spec, bags = kernel_view(shard, choice.pooled, ctx.batch_size)  # every rank's shard alike
    kernels = [KernelCall(r, kernel_group(choice), bags, spec) for r in ranks]
    exchanges: tuple[Exchange, ...] = ()
    if ctx.input_dist:
        flows = input_totals(ctx, t, dict.fromkeys(ranks, 1.0 / n))
        kind = choice.sharding_type
        exchanges = (Exchange(f"{kind}/in", "all_to_all", ctx.every_rank, flows),)  # type: ignore[arg-type]
    return Terms(tuple(kernels), exchanges)
