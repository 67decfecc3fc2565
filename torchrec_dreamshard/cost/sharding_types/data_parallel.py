"""Data-parallel: every rank holds the whole table and looks up its local batch.

Kernel at ``b`` on every rank and, backward, the all-reduce of ``S = R d e``. With a fitted
dense kernel (``ctx.dense_kernel``) one dense kernel per rank prices its DP tables;
otherwise the fused kernel at ``b`` plus ``4 R d e`` bytes at ``ctx.mem_bw``. Offered on
TorchRec's ``dense`` kernel, smallest tables first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from torchrec_dreamshard.cost.sharding import (
    CostContext,
    Exchange,
    KernelCall,
    OfferScope,
    SpansEveryRank,
    TableChoice,
    Terms,
    kernel_group,
    kernel_view,
    output_width_bytes,
)
from torchrec_dreamshard.data.tables import TableSpec

DENSE_UPDATE_PASSES = 4.0  # passes over a DP table's bytes per step, unfitted


class DataParallel(SpansEveryRank):
    name = "data_parallel"
    alternative_kernel = "dense"

    def terms(self, choice: TableChoice, ctx: CostContext) -> Terms:
        t, every = choice.table, ctx.every_rank
        table, bags = kernel_view(t, choice.pooled, ctx.local_batch)
        fitted = ctx.dense_kernel is not None
        group = kernel_group(choice)
        kernels = tuple(KernelCall(r, group, bags, table, dense=fitted) for r in every)
        grad = Exchange("data_parallel/grad", "all_reduce", every, buffer_bytes=t.size_bytes)
        dense = () if fitted else tuple((r, DENSE_UPDATE_PASSES * t.size_bytes) for r in every)
        return Terms(kernels, (grad,), dense)

    def candidate_key(self, table: TableSpec, single_ms: float) -> tuple[float, ...]:
        return (table.size_bytes,)

    def may_gain(self, table: TableSpec, pooled: bool, scope: OfferScope) -> bool:
        """A pruning rule, not a bound: offered only where the gradient all-reduce moves no
        more than the table-wise outputs it saves a receiving rank (within or across hosts).
        """
        if not scope.prune:
            return True
        topo = scope.topology
        w, lw, h = topo.world_size, topo.local_world_size, topo.num_hosts
        outputs = scope.local_batch * output_width_bytes(table, table.dim, pooled)
        within = 2.0 * table.size_bytes <= outputs
        across = h > 1 and (h - 1) / h * table.size_bytes / lw <= outputs * (w - lw) / w
        return within or across

    def reserve(self, shard_bytes: Sequence[float], free: np.ndarray) -> None:
        """A replica on every rank: shard ``k`` on rank ``k``."""
        n = len(free)
        np.add.at(free, np.arange(len(shard_bytes)) % n, -np.asarray(shard_bytes, dtype=float))
