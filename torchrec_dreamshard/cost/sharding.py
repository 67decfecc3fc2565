"""What one table costs each rank under each of TorchRec's sharding types.

Notation: global batch ``B`` (samples per step over all ranks), ``W`` ranks, local batch
``b = B / W``; a table of ``R`` rows, dim ``d``, pooling factor ``p`` (ids per sample) and
``e`` bytes per weight; ``I = 8`` bytes per id, ``N = 4`` per bag length, ``o = 4`` per
output element (fp32; quantised comms would lower it). The width of a sample's output is
``w = d`` for a pooled table (``EmbeddingBagCollection``) and ``w = p d`` for a sequence
table (``EmbeddingCollection``: one row per id, so outputs scale with ids times dim).

A term is one of three things, and :mod:`torchrec_dreamshard.cost.plans` prices them:

* kernel work: a table (or shard) looked up on a rank at a batch, priced by the caller's
  ``kernel_ms(tables, batch) -> (fwd_ms, bwd_ms)`` (the cost network) over every table one
  fused kernel serves. A sequence lookup of ``p`` ids per sample over ``B`` samples is
  priced as a pooled lookup of 1 id per bag over ``B p`` bags: the same ids, rows and
  elements gathered, and ``B p d`` outputs written;
* a share of a collective: flows ``F[i, j]`` (bytes rank ``i`` sends rank ``j``) of an
  all-to-all, or the per-rank buffer ``S`` of a reduce-scatter, all-gather or all-reduce;
* DP's dense passes over the table's bytes, priced at a memory bandwidth.

Per type (every non-DP type also has the input all-to-all of ids, ``F[i, j] = b (p s_j I
+ N)`` to each rank ``j`` that owns a share ``s_j`` of the table's ids):

* data-parallel: every rank looks up its local batch over the whole table
  (kernel at ``b``); backward, the all-reduce of the table's dense gradient ``S = R d e``
  over all ranks. TorchRec's DP is a dense kernel (FBGEMM's
  ``DenseTableBatchedEmbeddingBagsCodegen``) whose gradient DDP all-reduces whole, then
  the job's dense optimizer step. Where the machine's dense kernel is fitted
  (``ctx.dense_kernel``, :mod:`torchrec_dreamshard.measure.dense_kernels`), one dense
  kernel per rank over its DP tables is priced by that model, optimizer step included;
  elsewhere (accelerators we cannot time) as the fused kernel at ``b`` plus ``4 R d e``
  bytes of memory traffic (zeroing the gradient, reading it, reading and writing the
  weights) at ``ctx.mem_bw``.
* table-wise: one rank looks up the global batch (kernel at ``B``); its outputs go to
  every other rank, ``F[o, j] = b w o``, forward, and back, backward.
* column-wise: each shard (dim ``d_k``, the dim split evenly) acts as a table-wise table.
* row-wise: each of the ``W`` ranks holds ``ceil(R / W)`` rows and looks up the ids routed
  to it, ``B p s`` over ``B`` bags (every sample's partial sum); ``s`` is the busiest
  rank's share (:func:`routed_share`), charged to every rank. Pooled: the reduce-scatter
  of the partial sums, ``S = B d o``, forward, and the all-gather of their gradients,
  backward. Sequence (as TorchRec does it): an all-to-all of the looked-up rows to the
  samples' ranks, ``F[j, i] = b p d o / W``, and back.
* table-row-wise: row-wise over the ``L`` ranks of one host (reduce-scatter and
  all-gather within the host); then, across hosts, each host rank sends the ranks with
  its local index on every other host their samples' sums, ``F = b d o``, and back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from torchrec_dreamshard.cost.comm_topology import CommTopology
from torchrec_dreamshard.cost.physics import mean_access_count
from torchrec_dreamshard.data.tables import BIN_HIGH, BIN_LOW, TableSpec
from torchrec_dreamshard.measure.collectives import CollectiveModels
from torchrec_dreamshard.measure.dense_kernels import DenseKernelModel

SHARDING_TYPES = ("data_parallel", "table_wise", "column_wise", "row_wise", "table_row_wise")
SEQUENCE_TYPES = ("data_parallel", "table_wise", "column_wise", "row_wise")  # TorchRec's EC
ID_BYTES = 8  # bytes per id in an input all-to-all (int64)
LENGTH_BYTES = 4  # bytes per bag length (int32)
OUTPUT_BYTES = 4  # bytes per output element (fp32)
DENSE_UPDATE_PASSES = 4.0  # passes over a DP table's bytes per step (see the docstring)
DDR_MEM_BW = 51 * 1024**3 / 1000  # bytes/ms; TorchRec's DDR_MEM_BW (analytic)

KernelFn = Callable[[list[TableSpec], int], tuple[float, float]]
KernelsFn = Callable[[list[tuple[list[TableSpec], int]]], list[tuple[float, float]]]


@dataclass(frozen=True, kw_only=True)
class TableChoice:
    """A table's sharding type and ranks.

    Args:
        table: the table.
        sharding_type: one of :data:`SHARDING_TYPES` (TorchRec's ``ShardingType`` values).
        ranks: table-wise: its one rank; column-wise: one rank per shard; table-row-wise:
            the ranks of its host; data-parallel and row-wise: every rank (``()``).
        pooled: ``False`` for a sequence table (``EmbeddingCollection``).
    """

    table: TableSpec
    sharding_type: str
    ranks: tuple[int, ...] = ()
    pooled: bool = True


@dataclass(frozen=True, kw_only=True)
class CostContext:
    """What every term needs besides the table.

    Args:
        batch_size: the global batch ``B``.
        topology: ranks and hosts.
        collectives: the fitted (or analytic) collective models.
        kernel_ms: ``(tables, batch) -> (fwd_ms, bwd_ms)`` of one fused kernel.
        mem_bw: bytes/ms of the memory DP's dense passes stream through.
        input_dist: include the input all-to-all of ids (today's table-wise model leaves it
            out; ``False`` reproduces it).
        skew: charge row-wise shards the busiest rank's share of ids (else ``1 / n``).
        dense_grad_bytes: bytes of the dense part's gradients. DDP all-reduces them with
            the DP tables' gradients in one collective, so with them a DP table adds only
            its bytes to an all-reduce the job runs anyway; 0 charges the DP tables'
            all-reduce alone.
        kernels_ms: optional ``[(tables, batch), ...] -> [(fwd_ms, bwd_ms), ...]`` pricing
            every kernel of a plan in one call (used instead of ``kernel_ms`` when given).
        dense_kernel: the machine's fitted model of the dense kernel data-parallel tables
            run (``None``: DP is priced as the fused kernel plus dense passes at
            ``mem_bw``; see the module docstring).
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
        if not self.mem_bw > 0:
            raise ValueError(f"mem_bw must be > 0 bytes/ms, got {self.mem_bw!r}")

    @property
    def local_batch(self) -> float:
        return self.batch_size / self.topology.world_size


@dataclass(frozen=True)
class KernelCall:
    """``table`` looked up on ``rank`` over ``batch`` bags, in the kernel ``group`` (the
    fused kernel, or the dense one that data-parallel tables run when ``dense``)."""

    rank: int
    group: str
    batch: int
    table: TableSpec
    dense: bool = False


@dataclass(frozen=True, eq=False)
class Exchange:
    """A table's share of a collective; shares with equal ``(tag, kind, ranks)`` run as
    one collective. ``flows`` (``[W, W]`` bytes) for an all-to-all, else ``buffer_bytes``
    per rank."""

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


def routed_share(table: TableSpec, batch_size: int, num_shards: int) -> float:
    """The busiest of ``num_shards`` row shards' expected share of the table's ids.

    Rows are assumed hashed to shards independently of how hot they are. With ``U = L / m``
    accessed rows (``L = B p`` ids, ``m`` the mean access count) whose counts ``c`` follow
    the reuse histogram, a shard's share has mean ``1 / n`` and standard deviation
    ``sigma = sqrt((n - 1) U E[c^2]) / (n L)``; the busiest of ``n`` is about
    ``1 / n + sigma sqrt(2 ln n)`` (at most 1). Uniform access gives nearly ``1 / n``; a few
    very hot rows give more.
    """
    n = num_shards
    if n <= 1:
        return 1.0
    lookups = batch_size * table.pooling_factor
    hist = table.hist(batch_size)
    mean_sq = float(np.dot(hist, (BIN_LOW**2 + BIN_LOW * BIN_HIGH + BIN_HIGH**2) / 3.0))
    sigma = math.sqrt((n - 1) * lookups / mean_access_count(hist) * mean_sq) / (n * lookups)
    return min(1.0, 1.0 / n + sigma * math.sqrt(2.0 * math.log(n)))


def kernel_view(table: TableSpec, pooled: bool, bags: float) -> tuple[TableSpec, int]:
    """The pooled table and batch a kernel-time function prices: the table itself at
    ``bags`` for a pooled lookup; for a sequence lookup, 1 id per bag over ``bags * p``."""
    if pooled:
        return table, max(1, round(bags))
    flat = replace(table, pooling_factor=1.0, bag_length_cv=0.0)
    return flat, max(1, round(bags * table.pooling_factor))


def output_width_bytes(table: TableSpec, dim: int, pooled: bool) -> float:
    """Bytes of one sample's output of ``dim`` columns: ``dim o``, times ``p`` unpooled."""
    return dim * OUTPUT_BYTES * (1.0 if pooled else table.pooling_factor)


def input_flows(ctx: CostContext, table: TableSpec, shares: dict[int, float]) -> np.ndarray:
    """``F[i, j] = b (p s_j I + N)``: every rank's ids and lengths for rank ``j``."""
    f = np.zeros((ctx.topology.world_size,) * 2)
    for j, s in shares.items():
        f[:, j] = ctx.local_batch * (table.pooling_factor * s * ID_BYTES + LENGTH_BYTES)
    return f


def _both_ways(tag: str, ranks: tuple[int, ...], flows: np.ndarray) -> tuple[Exchange, ...]:
    """An all-to-all forward and its transpose backward."""
    return (
        Exchange(f"{tag}/fwd", "all_to_all", ranks, flows),
        Exchange(f"{tag}/bwd", "all_to_all", ranks, flows.T.copy()),
    )


def _group(choice: TableChoice) -> str:
    return f"{choice.sharding_type}/{'pooled' if choice.pooled else 'sequence'}"


def dp_terms(choice: TableChoice, ctx: CostContext) -> Terms:
    """Data-parallel (see the module docstring)."""
    t, every = choice.table, tuple(range(ctx.topology.world_size))
    table, bags = kernel_view(t, choice.pooled, ctx.local_batch)
    fitted = ctx.dense_kernel is not None
    kernels = tuple(KernelCall(r, _group(choice), bags, table, dense=fitted) for r in every)
    grad = Exchange("data_parallel/grad", "all_reduce", every, buffer_bytes=t.size_bytes)
    dense = () if fitted else tuple((r, DENSE_UPDATE_PASSES * t.size_bytes) for r in every)
    return Terms(kernels, (grad,), dense)


def _one_rank_terms(choice: TableChoice, ctx: CostContext, table: TableSpec, rank: int) -> Terms:
    """A table (or column shard) looked up whole on ``rank``: table-wise terms."""
    every, kind = tuple(range(ctx.topology.world_size)), choice.sharding_type
    spec, bags = kernel_view(table, choice.pooled, ctx.batch_size)
    out = np.zeros((len(every),) * 2)
    out[rank, :] = ctx.local_batch * output_width_bytes(table, table.dim, choice.pooled)
    exchanges = _both_ways(f"{kind}/out", every, out)
    if ctx.input_dist:
        flows = input_flows(ctx, table, {rank: 1.0})
        exchanges += (Exchange(f"{kind}/in", "all_to_all", every, flows),)
    return Terms((KernelCall(rank, _group(choice), bags, spec),), exchanges)


def tw_terms(choice: TableChoice, ctx: CostContext) -> Terms:
    """Table-wise (see the module docstring)."""
    return _one_rank_terms(choice, ctx, choice.table, choice.ranks[0])


def column_dims(dim: int, shards: int) -> list[int]:
    """The dim split as evenly as possible into ``shards`` column shards."""
    base, extra = divmod(dim, shards)
    return [base + (k < extra) for k in range(shards)]


def cw_terms(choice: TableChoice, ctx: CostContext) -> Terms:
    """Column-wise: each shard as a table-wise table (see the module docstring)."""
    t, terms = choice.table, Terms()
    dims = column_dims(t.dim, len(choice.ranks))
    for k, (rank, d) in enumerate(zip(choice.ranks, dims, strict=True)):
        terms += _one_rank_terms(choice, ctx, replace(t, name=f"{t.name}/cw{k}", dim=d), rank)
    return terms


def _row_shards(choice: TableChoice, ctx: CostContext, ranks: tuple[int, ...]) -> Terms:
    """The shard kernels and the input all-to-all of a table split by rows over ``ranks``."""
    t, n = choice.table, len(ranks)
    share = routed_share(t, ctx.batch_size, n) if ctx.skew else 1.0 / n
    shard = replace(t, rows=-(-t.rows // n), pooling_factor=t.pooling_factor * share)
    kernels = []
    for r in ranks:
        spec, bags = kernel_view(
            replace(shard, name=f"{t.name}/rw{r}"), choice.pooled, ctx.batch_size
        )
        kernels.append(KernelCall(r, _group(choice), bags, spec))
    exchanges: tuple[Exchange, ...] = ()
    if ctx.input_dist:
        flows = input_flows(ctx, t, dict.fromkeys(ranks, 1.0 / n))
        every = tuple(range(ctx.topology.world_size))
        exchanges = (Exchange(f"{choice.sharding_type}/in", "all_to_all", every, flows),)
    return Terms(tuple(kernels), exchanges)


def rw_terms(choice: TableChoice, ctx: CostContext) -> Terms:
    """Row-wise over every rank (see the module docstring)."""
    t, every = choice.table, tuple(range(ctx.topology.world_size))
    terms = _row_shards(choice, ctx, every)
    if choice.pooled:
        partial = ctx.batch_size * t.dim * OUTPUT_BYTES
        return terms + Terms(
            exchanges=(
                Exchange("row_wise/out/fwd", "reduce_scatter", every, buffer_bytes=partial),
                Exchange("row_wise/out/bwd", "all_gather", every, buffer_bytes=partial),
            )
        )
    rows_back = ctx.local_batch * output_width_bytes(t, t.dim, False) / len(every)
    flows = np.full((len(every),) * 2, rows_back)
    return terms + Terms(exchanges=_both_ways("row_wise/out", every, flows))


def twrw_terms(choice: TableChoice, ctx: CostContext) -> Terms:
    """Table-row-wise within one host, then across hosts (see the module docstring)."""
    t, topo, host = choice.table, ctx.topology, choice.ranks
    terms = _row_shards(choice, ctx, host)
    partial = ctx.batch_size * t.dim * OUTPUT_BYTES
    exchanges = (
        Exchange("table_row_wise/out/fwd", "reduce_scatter", host, buffer_bytes=partial),
        Exchange("table_row_wise/out/bwd", "all_gather", host, buffer_bytes=partial),
    )
    if topo.num_hosts > 1:
        flows = np.zeros((topo.world_size,) * 2)
        local = np.arange(topo.world_size) % topo.local_world_size
        for r in host:
            peers = (local == r % topo.local_world_size) & topo.remote_mask()[r]
            flows[r, peers] = ctx.local_batch * t.dim * OUTPUT_BYTES
        exchanges += _both_ways("table_row_wise/cross", tuple(range(topo.world_size)), flows)
    return terms + Terms(exchanges=exchanges)


_TERMS = {
    "data_parallel": dp_terms,
    "table_wise": tw_terms,
    "column_wise": cw_terms,
    "row_wise": rw_terms,
    "table_row_wise": twrw_terms,
}


def checked_choice(choice: TableChoice, topo: CommTopology) -> TableChoice:
    """``choice`` with its ranks filled in (every rank for DP and RW), or a
    ``ValueError`` that names the table and what its ranks should be."""
    kind, ranks, where = choice.sharding_type, tuple(choice.ranks), f"table {choice.table.name!r}"
    if kind not in SHARDING_TYPES:
        raise ValueError(f"{where}: unknown sharding type {kind!r}; expected {SHARDING_TYPES}")
    if not choice.pooled and kind not in SEQUENCE_TYPES:
        raise ValueError(f"{where}: a sequence table cannot be {kind}; use {SEQUENCE_TYPES}")
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < topo.world_size:
            raise ValueError(f"{where}: rank {r!r} is out of range 0..{topo.world_size - 1}")
    every = tuple(range(topo.world_size))
    if kind in ("data_parallel", "row_wise"):
        if ranks not in ((), every):
            raise ValueError(f"{where}: {kind} spans every rank; give ranks=() or {every}")
        ranks = every
    elif kind == "table_wise" and len(ranks) != 1:
        raise ValueError(f"{where}: table_wise needs exactly one rank, got {ranks}")
    elif kind == "column_wise" and not 1 <= len(ranks) <= choice.table.dim:
        raise ValueError(f"{where}: column_wise needs 1..dim ranks (one per shard), got {ranks}")
    elif kind == "table_row_wise":
        hosts = [topo.host_ranks(h) for h in range(topo.num_hosts)]
        if tuple(sorted(ranks)) not in hosts:
            raise ValueError(f"{where}: table_row_wise needs one host's ranks, one of {hosts}")
        ranks = tuple(sorted(ranks))
    return replace(choice, ranks=ranks)


def job_terms(ctx: CostContext) -> Terms:
    """What every plan of the job pays: the dense gradients' all-reduce, if any."""
    if not ctx.dense_grad_bytes:
        return Terms()
    every = tuple(range(ctx.topology.world_size))
    grad = Exchange("data_parallel/grad", "all_reduce", every, buffer_bytes=ctx.dense_grad_bytes)
    return Terms(exchanges=(grad,))


def table_terms(choice: TableChoice, ctx: CostContext) -> Terms:
    """The terms of ``choice`` (validated; see :func:`checked_choice`)."""
    choice = checked_choice(choice, ctx.topology)
    return _TERMS[choice.sharding_type](choice, ctx)
