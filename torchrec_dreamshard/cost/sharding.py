"""What one table costs each rank under a sharding type: its terms (kernel work, shares of
collectives, data-parallel's dense-pass bytes) and the interface every type implements.

Notation: global batch ``B``, ``W`` ranks, local batch ``b = B / W``; a table of ``R`` rows,
dim ``d``, pooling factor ``p``; ``I = 8`` bytes per id, ``N = 4`` per bag length, ``o = 4``
per output element; a sample's output width ``w`` is ``d`` pooled, ``p d`` for a sequence.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from torchrec_dreamshard.cost.collective_models import CollectiveModels
from torchrec_dreamshard.cost.comm_topology import CommTopology
from torchrec_dreamshard.cost.dense_kernel_model import DenseKernelModel
from torchrec_dreamshard.data.tables import TableSpec

ID_BYTES = 8  # bytes per id in an input all-to-all (int64)
LENGTH_BYTES = 4  # bytes per bag length (int32)
OUTPUT_BYTES = 4  # bytes per output element (fp32)
DDR_MEM_BW = 51 * 1024**3 / 1000  # bytes/ms; TorchRec's DDR_MEM_BW (analytic)

KernelFn = Callable[[list[TableSpec], int], tuple[float, float]]
KernelsFn = Callable[[list[tuple[list[TableSpec], int]]], list[tuple[float, float]]]


@dataclass(frozen=True, kw_only=True)
class TableChoice:
    """A table's sharding type and ranks.

    Args:
        sharding_type: a registered sharding type (TorchRec's ``ShardingType`` value).
        ranks: table-wise: its rank; column-wise: one per shard; table-row-wise: its host's
            ranks; data-parallel and row-wise: ``()`` (every rank).
        pooled: ``False`` for a sequence table (``EmbeddingCollection``).
    """

    table: TableSpec
    sharding_type: str
    ranks: tuple[int, ...] = ()
    pooled: bool = True

    @property
    def label(self) -> str:
        """How errors name the choice: ``table 'name'``."""
        return f"table {self.table.name!r}"


@dataclass(frozen=True, kw_only=True)
class CostContext:
    """What every term needs besides the table.

    Args:
        kernel_ms: ``(tables, batch) -> (fwd_ms, bwd_ms)`` of one fused kernel.
        mem_bw: bytes/ms of data-parallel's dense passes.
        input_dist: include the input all-to-all of ids.
        skew: charge row-wise shards the busiest rank's share of ids (else ``1 / n``).
        dense_grad_bytes: the dense part's gradient bytes, all-reduced with DP tables' (0:
            DP tables pay their all-reduce alone).
        kernels_ms: optional batched ``kernel_ms`` over every kernel of a plan.
        dense_kernel: the fitted dense-kernel model (``None``: fused kernel plus dense passes).
        path_ms: per-rank ms of one non-DP sharding path, once per path (0: not charged).
    """

    batch_size: int
    topology: CommTopology
    collectives: CollectiveModels
    kernel_ms: KernelFn
    mem_bw: float = DDR_MEM_BW
    input_dist: bool = True
    skew: bool = True
    dense_grad_bytes: float = 0.0
    kernels_ms: KernelsFn | None = None
    dense_kernel: DenseKernelModel | None = None
    path_ms: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int):
            raise ValueError(f"batch_size must be an integer, got {self.batch_size!r}")
        if self.batch_size < self.topology.world_size:
            raise ValueError(
                f"batch_size {self.batch_size} is smaller than the world size "
                f"{self.topology.world_size}: every rank needs a sample"
            )
        if not self.dense_grad_bytes >= 0:
            raise ValueError(f"dense_grad_bytes must be >= 0, got {self.dense_grad_bytes!r}")
        if not (math.isfinite(self.path_ms) and self.path_ms >= 0):
            raise ValueError(f"path_ms must be a finite number >= 0, got {self.path_ms!r}")
        if not self.mem_bw > 0:
            raise ValueError(f"mem_bw must be > 0 bytes/ms, got {self.mem_bw!r}")

    @property
    def local_batch(self) -> float:
        return self.batch_size / self.topology.world_size

    @property
    def every_rank(self) -> tuple[int, ...]:
        return tuple(range(self.topology.world_size))


@dataclass(frozen=True)
class KernelCall:
    """``table`` looked up on ``rank`` over ``batch`` bags in kernel ``group`` (dense for DP)."""

    rank: int
    group: str
    batch: int
    table: TableSpec
    dense: bool = False


@dataclass(frozen=True, eq=False)
class Exchange:
    """A table's share of a collective (equal ``(tag, kind, ranks)`` run as one): ``flows``
    (``[W, W]`` bytes) for an all-to-all, else ``buffer_bytes`` per rank."""

    tag: str
    kind: str
    ranks: tuple[int, ...]
    flows: np.ndarray | None = None
    buffer_bytes: float = 0.0


@dataclass(frozen=True)
class Terms:
    """Kernel work, collective shares and DP dense-pass bytes ``(rank, bytes)``."""

    kernels: tuple[KernelCall, ...] = ()
    exchanges: tuple[Exchange, ...] = ()
    dense_bytes: tuple[tuple[int, float], ...] = ()

    def __add__(self, other: Terms) -> Terms:
        return Terms(
            self.kernels + other.kernels,
            self.exchanges + other.exchanges,
            self.dense_bytes + other.dense_bytes,
        )


@dataclass(frozen=True)
class OfferScope:
    """What pruning a type's offers reads: topology, local batch, the mean device's
    lookups per sample (``sum p d / W``), and whether to prune at all.
    """

    topology: CommTopology
    local_batch: float
    mean_lookups: float
    prune: bool = True


class ShardingCost:
    """One sharding type's stateless cost strategy: its terms, rank rules, and how the type
    choice tries it.

    Attributes:
        name: TorchRec's ``ShardingType`` value.
        aliases: other TorchRec sharding types priced as this one.
        sequence: whether a sequence table may take it.
        alternative_kernel: the compute kernel the type choice offers it on instead of
            table-wise (``None``: not offered).
    """

    name: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    sequence: ClassVar[bool] = True
    alternative_kernel: ClassVar[str | None] = None

    def terms(self, choice: TableChoice, ctx: CostContext) -> Terms:
        """The kernels and collective shares of ``choice`` (its ranks already checked)."""
        raise NotImplementedError

    def check_ranks(self, choice: TableChoice, topo: CommTopology) -> tuple[int, ...]:
        """``choice``'s ranks as :meth:`terms` reads them, or a ``ValueError`` naming the table."""
        raise NotImplementedError

    def option_ranks(self, shard_ranks: Sequence[int]) -> tuple[int, ...]:
        """A placed TorchRec option's ranks as a :class:`TableChoice` takes them."""
        return tuple(shard_ranks)

    def candidate_key(self, table: TableSpec, single_ms: float) -> tuple[float, ...]:
        """Sort key (ascending) of ``table`` in the type choice's order for this type."""
        raise NotImplementedError(f"the type choice does not offer {self.name}")

    def may_gain(self, table: TableSpec, pooled: bool, scope: OfferScope) -> bool:
        """Whether moving ``table`` from table-wise to this type may lower the step."""
        return True

    def candidate_ranks(self, turn: int, topo: CommTopology) -> tuple[int, ...]:
        """The ranks of the ``turn``-th table a candidate moves to this type."""
        return ()

    def reserve(self, shard_bytes: Sequence[float], free: np.ndarray) -> None:
        """Take a table's shards out of each rank's ``free`` bytes (shard ``k`` on rank ``k``
        with one per rank, else spread evenly)."""
        n = len(free)
        every = len(shard_bytes) == n
        for k, nbytes in enumerate(shard_bytes):
            if every:
                free[k % n] -= nbytes
            else:
                free -= nbytes / n


class SpansEveryRank(ShardingCost):
    """A type whose table spans every rank: its ranks are ``()`` or all of them."""

    def check_ranks(self, choice: TableChoice, topo: CommTopology) -> tuple[int, ...]:
        every = tuple(range(topo.world_size))
        if tuple(choice.ranks) not in ((), every):
            raise ValueError(
                f"{choice.label}: {self.name} spans every rank; give ranks=() or {every}"
            )
        return every

    def option_ranks(self, shard_ranks: Sequence[int]) -> tuple[int, ...]:
        return ()


def kernel_view(table: TableSpec, pooled: bool, bags: float) -> tuple[TableSpec, int]:
    """The pooled table and batch a kernel prices (sequence: 1 id per bag over ``bags * p``)."""
    if pooled:
        return table, max(1, round(bags))
    flat = replace(table, pooling_factor=1.0, bag_length_cv=0.0)
    return flat, max(1, round(bags * table.pooling_factor))


def kernel_group(choice: TableChoice) -> str:
    """The fused kernel a choice's lookups join on a rank: one per type, pooled or not."""
    return f"{choice.sharding_type}/{'pooled' if choice.pooled else 'sequence'}"


def output_width_bytes(table: TableSpec, dim: int, pooled: bool) -> float:
    """Bytes of one sample's output of ``dim`` columns: ``dim o``, times ``p`` unpooled."""
    return dim * OUTPUT_BYTES * (1.0 if pooled else table.pooling_factor)


PATH_KIND = "sharding_path"  # the exchange kind of a sharding path's fixed cost


def path_exchange(choice: TableChoice, ctx: CostContext) -> Exchange:
    """``choice``'s share of its sharding path (the same for every table of it: paid once)."""
    module = "pooled" if choice.pooled else "sequence"
    return Exchange(f"{choice.sharding_type}/{module}/path", PATH_KIND, ctx.every_rank)


def path_cost(ranks: Sequence[int], ctx: CostContext) -> np.ndarray:
    """``[W]`` ms of one sharding path: ``ctx.path_ms`` on each of ``ranks``."""
    out = np.zeros(ctx.topology.world_size)
    out[list(ranks)] = ctx.path_ms
    return out


def both_ways(tag: str, ranks: tuple[int, ...], flows: np.ndarray) -> tuple[Exchange, ...]:
    """An all-to-all forward and its transpose backward."""
    return (
        Exchange(f"{tag}/fwd", "all_to_all", ranks, flows),
        Exchange(f"{tag}/bwd", "all_to_all", ranks, flows.T.copy()),
    )


def job_terms(ctx: CostContext) -> Terms:
    """What every plan of the job pays: the dense gradients' all-reduce, if any."""
    if not ctx.dense_grad_bytes:
        return Terms()
    grad = Exchange(
        "data_parallel/grad", "all_reduce", ctx.every_rank, buffer_bytes=ctx.dense_grad_bytes
    )
    return Terms(exchanges=(grad,))
