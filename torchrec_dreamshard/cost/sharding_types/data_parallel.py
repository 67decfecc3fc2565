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
    SpansEveryRank,
    TableChoice,
    Terms,
    kernel_group,
    kernel_view,
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

    def reserve(self, shard_bytes: Sequence[float], free: np.ndarray) -> None:
        """A replica on every rank: shard ``k`` on rank ``k``."""
        for k, nbytes in enumerate(shard_bytes):
            free[k % len(free)] -= nbytes
