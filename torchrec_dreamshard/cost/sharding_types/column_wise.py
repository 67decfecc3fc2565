"""Column-wise: the dim split evenly, each shard priced as a table-wise table on its rank
(table-column-wise too). The split search, not the type choice, decides the splits.
"""

from __future__ import annotations

from dataclasses import replace

from torchrec_dreamshard.cost.comm_topology import CommTopology
from torchrec_dreamshard.cost.sharding import (
    CostContext,
    ShardingCost,
    TableChoice,
    Terms,
)
from torchrec_dreamshard.cost.sharding_types.table_wise import one_rank_terms


class ColumnWise(ShardingCost):
    name = "column_wise"
    aliases = ("table_column_wise",)

    def terms(self, choice: TableChoice, ctx: CostContext) -> Terms:
        t, terms = choice.table, Terms()
        dims = column_dims(t.dim, len(choice.ranks))
        for k, (rank, d) in enumerate(zip(choice.ranks, dims, strict=True)):
            shard = replace(t, name=f"{t.name}/cw{k}", dim=d)
            terms += one_rank_terms(choice, ctx, shard, rank)
        return terms

    def check_ranks(self, choice: TableChoice, topo: CommTopology) -> tuple[int, ...]:
        ranks = tuple(choice.ranks)
        if not 1 <= len(ranks) <= choice.table.dim:
            raise ValueError(
                f"{choice.label}: column_wise needs 1..dim ranks (one per shard), got {ranks}"
            )
        return ranks


def column_dims(dim: int, shards: int) -> list[int]:
    """The dim split as evenly as possible into ``shards`` column shards."""
    base, extra = divmod(dim, shards)
    return [base + (k < extra) for k in range(shards)]
