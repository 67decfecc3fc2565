"""Table-wise: one rank holds the table and looks up the global batch.

Kernel at ``B`` on its rank; its outputs go to every other rank, ``F[o, j] = b w o``,
forward, and back, backward; and the input all-to-all of ids to its rank. The policy
places table-wise tables; the type choice rates every other type against all-table-wise.
"""

from __future__ import annotations

import numpy as np

from torchrec_dreamshard.cost.comm_topology import CommTopology
from torchrec_dreamshard.cost.sharding import (
    CostContext,
    Exchange,
    KernelCall,
    ShardingCost,
    TableChoice,
    Terms,
    both_ways,
    input_flows,
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
    every, kind = ctx.every_rank, choice.sharding_type
    spec, bags = kernel_view(table, choice.pooled, ctx.batch_size)
    out = np.zeros((len(every),) * 2)
    out[rank, :] = ctx.local_batch * output_width_bytes(table, table.dim, choice.pooled)
    exchanges = both_ways(f"{kind}/out", every, out)
    if ctx.input_dist:
        flows = input_flows(ctx, table, {rank: 1.0})
        exchanges += (Exchange(f"{kind}/in", "all_to_all", every, flows),)
    return Terms((KernelCall(rank, kernel_group(choice), bags, spec),), exchanges)
