"""Data-parallel: every rank holds the whole table and looks up its local batch.

Kernel at ``b`` on every rank; backward, the all-reduce of the table's dense gradient
``S = R d e`` over all ranks. TorchRec's DP is a dense kernel (FBGEMM's
``DenseTableBatchedEmbeddingBagsCodegen``) whose gradient DDP all-reduces whole, then the
job's dense optimizer step. Where the machine's dense kernel is fitted
(``ctx.dense_kernel``, :mod:`torchrec_dreamshard.measure.dense_kernels`), one dense kernel
per rank over its DP tables is priced by that model, optimizer step included; elsewhere
(accelerators we cannot time) as the fused kernel at ``b`` plus ``4 R d e`` bytes of memory
traffic (zeroing the gradient, reading it, reading and writing the weights) at
``ctx.mem_bw``.

The type choice offers it on TorchRec's ``dense`` kernel and tries the smallest tables
first: replicating a table costs an all-reduce of its bytes and a pass over them on every
rank, and saves its all-to-all and its kernel at the global batch.
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

DENSE_UPDATE_PASSES = 4.0  # passes over a DP table's bytes per step (see the docstring)


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
        """A pruning rule for large models, not a bound: offered only where the table's
        gradients' all-reduce moves no more than the table-wise outputs it saves a rank
        that receives them, forward and backward: on the wire (send plus receive)
        ``4 (W-1)/W S <= 2 b w o (W-1)/W``, or across hosts (``H`` hosts of ``L``)
        ``2 (H-1)/H S / L <= 2 b w o (W-L)/W``. Replicating may still pay beyond it (the
        rank that held the table also sends its outputs to every rank and receives its
        ids, and loses its kernel), so small models are offered every type
        (``scope.prune`` false). At 1000 tables on 128 GPUs it offers about 40% of the
        tables, and the sweep's best prefix lies inside them
        ([sharding_types.md](../../../docs/sharding_types.md#at-scale))."""
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
