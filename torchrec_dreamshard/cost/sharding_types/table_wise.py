"""Table-wise: one rank holds the table and looks up the global batch.

Kernel at ``B`` on its rank; outputs ``F[o, j] = b w o`` to every rank forward and back
backward; and the input all-to-all of ids.
"""

from __future__ import annotations

import numpy as np

from torchrec_dreamshard.cost.comm_topology import CommTopology, FlowTotals
from torchrec_dreamshard.cost.sharding import (
    ID_BYTES,
    LENGTH_BYTES,
    CostContext,
    Exchange,
    KernelCall,
    ShardingCost,
    TableChoice,
    Terms,
    both_ways,
    kernel_group,
    kernel_view,
    output_width_bytes,
)
from torchrec_dreamshard.data.tables import TableSpec


class TableWise(ShardingCost):
    name = "table_wise"

    def terms(self, choice: TableChoice, ctx: CostContext) -> Terms:
        return one_rank_terms(choice, ctx, choice.table, choice.ranks[0])

    def check_ranks(self, choice: TableChoice, topo: CommTopology) -> tuple[int, ...]:
        ranks = tuple(choice.ranks)
        if len(ranks) != 1:
            raise ValueError(f"{choice.label}: table_wise needs exactly one rank, got {ranks}")
        return ranks


def one_rank_terms(choice: TableChoice, ctx: CostContext, table: TableSpec, rank: int) -> Terms:
    """A table (or column shard) looked up whole on ``rank``: table-wise terms."""
    every, kind, topo = ctx.every_rank, choice.sharding_type, ctx.topology
    spec, bags = kernel_view(table, choice.pooled, ctx.batch_size)
    width = output_width_bytes(table, table.dim, choice.pooled)
    out = FlowTotals.one_to_all(topo, rank, ctx.local_batch * width)
    exchanges = both_ways(f"{kind}/out", every, out)  # type: ignore[arg-type]
    if ctx.input_dist:
        flows = input_totals(ctx, table, {rank: 1.0})
        exchanges += (Exchange(f"{kind}/in", "all_to_all", every, flows),)  # type: ignore[arg-type]
    return Terms((KernelCall(rank, kernel_group(choice), bags, spec),), exchanges)


def input_totals(ctx: CostContext, table: TableSpec, shares: dict[int, float]) -> FlowTotals:
    """The input all-to-all ``F[i, j] = b (p s_j I + N)`` as :class:`FlowTotals`."""
    topo = ctx.topology
    each = {
        j: ctx.local_batch * (table.pooling_factor * s * ID_BYTES + LENGTH_BYTES)
        for j, s in shares.items()
    }
    if len(each) == 1:  # one owner: the reverse of one rank sending to all
        ((j, nbytes),) = each.items()
        return FlowTotals.one_to_all(topo, j, nbytes).T
    dst = np.zeros(topo.world_size)
    dst[list(each)] = list(each.values())
    return FlowTotals.outer(topo, np.ones(topo.world_size), dst)
