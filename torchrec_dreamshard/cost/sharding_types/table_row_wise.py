"""Table-row-wise: row-wise over the ``L`` ranks of one host, then across hosts.

Row-wise terms within the host (reduce-scatter and all-gather of ``S = B d o``); across
hosts each rank exchanges ``F = b d o`` with its local index on every other host. Not for
sequence tables. Offered on the fused kernel, hottest first, hosts in turn.
"""

from __future__ import annotations

import numpy as np

from torchrec_dreamshard.cost.comm_topology import CommTopology, FlowTotals
from torchrec_dreamshard.cost.sharding import (
    OUTPUT_BYTES,
    CostContext,
    Exchange,
    ShardingCost,
    TableChoice,
    Terms,
    both_ways,
)
from torchrec_dreamshard.cost.sharding_types.row_wise import row_shard_terms
from torchrec_dreamshard.data.tables import TableSpec


class TableRowWise(ShardingCost):
    name = "table_row_wise"
    sequence = False
    alternative_kernel = "fused"

    def terms(self, choice: TableChoice, ctx: CostContext) -> Terms:
        t, topo, host = choice.table, ctx.topology, choice.ranks
        terms = row_shard_terms(choice, ctx, host)
        partial = ctx.batch_size * t.dim * OUTPUT_BYTES
        exchanges = (
            Exchange("table_row_wise/out/fwd", "reduce_scatter", host, buffer_bytes=partial),
            Exchange("table_row_wise/out/bwd", "all_gather", host, buffer_bytes=partial),
        )
        if topo.num_hosts > 1:
            flows = cross_host_totals(topo, host, ctx.local_batch * t.dim * OUTPUT_BYTES)
            exchanges += both_ways("table_row_wise/cross", ctx.every_rank, flows)  # type: ignore[arg-type]
        return terms + Terms(exchanges=exchanges)

    def check_ranks(self, choice: TableChoice, topo: CommTopology) -> tuple[int, ...]:
        hosts = [topo.host_ranks(h) for h in range(topo.num_hosts)]
        ranks = tuple(sorted(choice.ranks))
        if ranks not in hosts:
            raise ValueError(
                f"{choice.label}: table_row_wise needs one host's ranks, one of {hosts}"
            )
        return ranks

    def candidate_key(self, table: TableSpec, single_ms: float) -> tuple[float, ...]:
        return (-single_ms,)

    def candidate_ranks(self, turn: int, topo: CommTopology) -> tuple[int, ...]:
        return topo.host_ranks(turn % topo.num_hosts)


def cross_host_totals(topo: CommTopology, host: tuple[int, ...], nbytes: float) -> FlowTotals:
    """Each rank of ``host`` sends ``nbytes`` to its local index on every other host."""
    sent, recv = np.zeros(topo.world_size), np.zeros(topo.world_size)
    local = np.arange(topo.world_size) % topo.local_world_size
    home = topo.host_of(host[0])
    others = np.arange(topo.world_size) // topo.local_world_size != home
    for r in host:
        peers = np.flatnonzero(others & (local == r % topo.local_world_size))
        sent[r] += nbytes * len(peers)
        recv[peers] += nbytes
    return FlowTotals(sent, recv, sent, recv)
