"""Real FBGEMM fused kernels, one per device, timed: each iteration on a fresh batch of ids,
weights in written (not zero-page) memory, the backward running the fused optimizer."""

from __future__ import annotations

import statistics
import time
import zlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.workloads import fuse_batches, generate_batch
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.gate import check_may_measure
from torchrec_dreamshard.measure.rounds import measure_in_rounds
from torchrec_dreamshard.threads import single_thread

# The fixed reference kernel timed beside every measurement (rows, dim, pooling factor).
REFERENCE_TABLES: tuple[TableSpec, ...] = tuple(
    TableSpec(name=f"reference_{i}", rows=rows, dim=dim, pooling_factor=pf)
    for i, (rows, dim, pf) in enumerate(
        [(50_000, 16, 4.0), (100_000, 32, 8.0), (50_000, 64, 8.0), (20_000, 128, 4.0)]
    )
)
REFERENCE_BATCH_SIZE = 2048
REFERENCE_CONFIG_FIELDS = {"optimizer": "rowwise_adagrad", "precision": "fp32"}
_BATCH_CACHE_ENTRIES = 4096  # per-table batches kept (a 40-table task with a ring of 6: 240)
_ARENA_BLOCK = 1 << 20  # elements of the random block tiled over the arena
_LEARNING_RATE = 0.01


def _fbgemm():
    """FBGEMM's training TBE module and enums (imported lazily: loading it takes a second)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    return (
        SplitTableBatchedEmbeddingBagsCodegen,
        EmbOptimType,
        SparseType,
        EmbeddingLocation,
        ComputeDevice,
    )


def optim_type(name: str):
    """FBGEMM's optimizer enum for a :class:`MeasureConfig` optimizer name."""
    _, opt, _, _, _ = _fbgemm()
    return {
        "rowwise_adagrad": opt.EXACT_ROWWISE_ADAGRAD,
        "sgd": opt.EXACT_SGD,
        "adagrad": opt.EXACT_ADAGRAD,
    }[name]


_BATCHES: OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()


def table_batch(spec: TableSpec, batch_size: int, seed: int, k: int) -> tuple[torch.Tensor, ...]:
    """Batch ``k`` of the ring of ``spec`` (cached; deterministic in seed, k and the table)."""
    key = (spec, batch_size, seed, k)
    hit = _BATCHES.get(key)
    if hit is not None:
        _BATCHES.move_to_end(key)
        return hit
    rng = np.random.default_rng([seed, k, zlib.crc32(spec.name.encode()), spec.rows, spec.dim])
    batch = generate_batch(spec, batch_size, rng)
    _BATCHES[key] = batch
    while len(_BATCHES) > _BATCH_CACHE_ENTRIES:
        _BATCHES.popitem(last=False)
    return batch


def fused_ring(
    tables: Sequence[TableSpec], batch_size: int, seed: int, size: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``size`` distinct fused batches ``(indices, offsets)`` in FBGEMM's table-major layout."""
    return [
        fuse_batches([table_batch(spec, batch_size, seed, k) for spec in tables])
        for k in range(size)
    ]


class Arena:
    """A reusable host buffer written with small random values; kernels take slices of it."""

    def __init__(self) -> None:
        self.buffer = torch.empty(0)
        self.used = 0

    def reserve(self, numel: int) -> None:
        """Make room for ``numel`` elements and start handing out slices from the beginning."""
        self.used = 0
        if self.buffer.numel() >= numel:
            return
        self.buffer = torch.empty(0)  # free the old one first
        buf = torch.empty(numel)
        block = torch.empty(min(_ARENA_BLOCK, numel)).uniform_(0.001, 0.01)
        full = numel // block.numel()
        buf[: full * block.numel()].view(full, -1).copy_(block)
        rest = numel - full * block.numel()
        if rest:
            buf[-rest:].copy_(block[:rest])
        self.buffer = buf

    def take(self, numel: int) -> torch.Tensor:
        """The next ``numel`` elements (a contiguous 1-D view)."""
        if self.used + numel > self.buffer.numel():
            raise RuntimeError(
                f"arena holds {self.buffer.numel()} elements, asked for {self.used + numel}"
            )
        out = self.buffer[self.used : self.used + numel]
        self.used += numel
        return out


ARENA = Arena()


def state_numel(tables: Sequence[TableSpec], optimizer: str) -> tuple[int, int]:
    """Elements of weights and of optimizer state the kernel over ``tables`` needs."""
    weights = sum(t.rows * t.dim for t in tables)
    momentum = {
        "rowwise_adagrad": sum(t.rows for t in tables),
        "adagrad": weights,
        "sgd": 0,
    }[optimizer]
    return weights, momentum


class FusedKernel:
    """One FBGEMM ``SplitTableBatchedEmbeddingBagsCodegen`` over a set of tables.

    Args:
        tables: the tables (each dim a multiple of 4, as FBGEMM requires).
        arena: host memory to build CPU kernels in (its slices stay taken until the kernel
            is dropped); ``None``: the shared arena, reserved for this kernel alone.
    """

    def __init__(
        self,
        tables: Sequence[TableSpec],
        batch_size: int,
        config: MeasureConfig,
        arena: Arena | None = None,
    ) -> None:
        if not tables:
            raise ValueError("a fused kernel needs at least one table")
        bad = [t.name for t in tables if t.dim % 4]
        if bad:
            raise ValueError(f"tables {bad}: FBGEMM needs every dim to be a multiple of 4")
        self.tables = list(tables)
        self.config = config
        self.device = torch.device("cuda" if config.device == "cuda" else "cpu")
        self.emb = self._build(arena)
        self.ring = [
            (i.to(self.device), o.to(self.device))
            for i, o in fused_ring(self.tables, batch_size, config.seed, config.iters + 1)
        ]
        self.pooled_dim = sum(t.dim for t in self.tables)
        gen = torch.Generator().manual_seed(config.seed)
        self.grad = torch.randn(batch_size, self.pooled_dim, generator=gen).to(self.device)
        self.calls = 0

    def _build(self, arena: Arena | None):
        tbe, _, sparse, location, compute = _fbgemm()
        cfg = self.config
        on_cpu = cfg.device == "cpu"
        specs = [
            (
                t.rows,
                t.dim,
                location.HOST if on_cpu else location.DEVICE,
                compute.CPU if on_cpu else compute.CUDA,
            )
            for t in self.tables
        ]
        prealloc = None
        if on_cpu:
            weights, momentum = state_numel(self.tables, cfg.optimizer)
            if arena is None:
                arena = ARENA
                arena.reserve(weights + momentum)
            prealloc = {"weights": arena.take(weights)}
            if momentum:
                # positive whatever earlier kernels left there (negative Adagrad state: NaN)
                prealloc["momentum1"] = arena.take(momentum).fill_(0.01)
        emb = tbe(
            specs,
            optimizer=optim_type(cfg.optimizer),
            learning_rate=_LEARNING_RATE,
            weights_precision=sparse.FP16 if cfg.precision == "fp16" else sparse.FP32,
            output_dtype=sparse.FP32,
            device=self.device,
            preallocated_host_buffers=prealloc,
        )
        if not on_cpu:  # device memory: write the weights and the optimizer state
            for w in emb.split_embedding_weights():
                w.uniform_(0.001, 0.01)
            state = getattr(emb, "momentum1_dev", None)
            if isinstance(state, torch.Tensor) and state.numel():
                state.fill_(0.01)
        return emb

    def step(self) -> tuple[float, float]:
        """One training iteration on the next batch of the ring: ``(fwd_ms, bwd_ms)``."""
        ids, offsets = self.ring[self.calls % len(self.ring)]
        self.calls += 1
        if self.device.type == "cuda":
            return self._step_cuda(ids, offsets)
        t0 = time.perf_counter()
        out = self.emb(ids, offsets)
        t1 = time.perf_counter()
        out.backward(self.grad)
        t2 = time.perf_counter()
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3

    def _step_cuda(self, ids: torch.Tensor, offsets: torch.Tensor) -> tuple[float, float]:
        start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        torch.cuda.synchronize(self.device)
        start.record()
        out = self.emb(ids, offsets)
        mid.record()
        out.backward(self.grad)
        end.record()
        torch.cuda.synchronize(self.device)
        return start.elapsed_time(mid), mid.elapsed_time(end)

    def run_round(self, warmup: int, iters: int) -> tuple[float, float]:
        """``warmup`` untimed then ``iters`` timed iterations: median ``(fwd_ms, bwd_ms)``."""
        for _ in range(warmup):
            self.step()
        times = [self.step() for _ in range(iters)]
        return statistics.median(f for f, _ in times), statistics.median(b for _, b in times)


def reference_kernel(config: MeasureConfig, arena: Arena | None = None) -> FusedKernel:
    """The fixed reference kernel (row-wise Adagrad, fp32, batch 2048) on ``config``'s device."""
    from dataclasses import replace

    ref_config = replace(config, **REFERENCE_CONFIG_FIELDS)
    return FusedKernel(REFERENCE_TABLES, REFERENCE_BATCH_SIZE, ref_config, arena)


def reference_numel(config: MeasureConfig) -> int:
    """Arena elements the reference kernel needs."""
    return sum(state_numel(REFERENCE_TABLES, REFERENCE_CONFIG_FIELDS["optimizer"]))


def time_kernels(kernels: Sequence[FusedKernel | None], config: MeasureConfig) -> np.ndarray:
    """Time ``kernels`` against each other in ``config.rounds`` interleaved rounds (one
    warm-up iteration on each later visit, to bring a kernel's data back to cache).

    Returns:
        ``[rounds, len(kernels), 2]`` medians of ``(fwd_ms, bwd_ms)``; zeros for ``None``.
    """
    check_may_measure("time_kernels")
    visited: set[int] = set()

    def run(_: int, k: int) -> tuple[float, float]:
        kernel = kernels[k]
        if kernel is None:
            return (0.0, 0.0)
        warmup = min(1, config.warmup) if k in visited else config.warmup
        visited.add(k)
        return kernel.run_round(warmup, config.iters)

    rounds = measure_in_rounds([list(range(len(kernels)))], run, config.rounds)[0]
    out = np.zeros((config.rounds, len(kernels), 2))
    for r, times in enumerate(rounds):
        for k, fwd_bwd in times.items():
            out[r, k] = fwd_bwd
    return out


def time_fused_kernel(
    tables: Sequence[TableSpec], batch_size: int, config: MeasureConfig | None = None
) -> tuple[float, float]:
    """``(fwd_ms, bwd_ms)`` of one fused kernel over ``tables``: the minimum over rounds of
    the median over timed iterations."""
    config = config or MeasureConfig()
    with single_thread(config.device == "cpu"):
        kernel = FusedKernel(tables, batch_size, config)
        rounds = time_kernels([kernel], config)
    fwd, bwd = rounds[:, 0, 0].min(), rounds[:, 0, 1].min()
    return float(fwd), float(bwd)
