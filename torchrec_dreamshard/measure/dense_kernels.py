"""FBGEMM's dense kernel of data-parallel tables, timed with an Adagrad step, and the random
table sets :mod:`torchrec_dreamshard.cost.dense_kernel_model` is fitted to."""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Sequence

import numpy as np
import torch

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.measure.embedding_kernels import fused_ring
from torchrec_dreamshard.measure.gate import check_may_measure
from torchrec_dreamshard.measure.group_tasks import run_on_group
from torchrec_dreamshard.ranks.job_group import JobGroup, active_group, group_task, my_share
from torchrec_dreamshard.threads import single_thread

_FIT_SETS = 28  # random table sets timed to fit the model
_MAX_WEIGHT_ELEMENTS = 8_000_000  # per timed set (32 MB of fp32)
_WARMUP, _ITERS = 2, 5
_LEARNING_RATE = 0.01
# PyTorch says FBGEMM's dense lookup has no autograd kernel; FBGEMM's Python function has one
_NO_AUTOGRAD_KERNEL = ".*dense_embedding_codegen_lookup_function: an autograd kernel"


def time_dense_kernel(
    tables: Sequence[TableSpec], batch_size: int, device: str = "cpu", seed: int = 0
) -> tuple[float, float]:
    """Median ``(fwd_ms, bwd_ms)`` of the dense kernel over ``tables``, backward with an
    Adagrad step (one thread on CPU)."""
    check_may_measure("time_dense_kernel")
    dev = torch.device(device)
    with single_thread(device == "cpu"):
        emb = dense_kernel(tables, device)
        optimizer = torch.optim.Adagrad(emb.parameters(), lr=_LEARNING_RATE)
        ring = [(i.to(dev), o.to(dev)) for i, o in fused_ring(tables, batch_size, seed, 3)]
        grad = torch.randn(batch_size, sum(t.dim for t in tables), device=dev)
        times = []
        for k in range(_WARMUP + _ITERS):
            fb = _dense_step(emb, optimizer, ring[k % len(ring)], grad, dev)
            if k >= _WARMUP:
                times.append(fb)
    return statistics.median(f for f, _ in times), statistics.median(b for _, b in times)


def dense_kernel(tables: Sequence[TableSpec], device: str = "cpu") -> torch.nn.Module:
    """FBGEMM's dense kernel over ``tables`` as TorchRec's data-parallel sharding runs it."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        DenseTableBatchedEmbeddingBagsCodegen,
    )

    emb = DenseTableBatchedEmbeddingBagsCodegen(
        [(t.rows, t.dim) for t in tables], use_cpu=device == "cpu"
    ).to(torch.device(device))
    with torch.no_grad():
        emb.weights.uniform_(0.001, 0.01)
    return emb


def backward_through(out: torch.Tensor, grad: torch.Tensor) -> None:
    """``out.backward(grad)`` without the no-autograd-kernel warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _NO_AUTOGRAD_KERNEL, UserWarning)
        out.backward(grad)


def _dense_step(emb, optimizer, batch, grad, dev: torch.device) -> tuple[float, float]:
    def now() -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter()

    ids, offsets = batch
    t0 = now()
    out = emb(ids, offsets)
    t1 = now()
    backward_through(out, grad)
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
    t2 = now()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3


def random_dense_sets(count: int = _FIT_SETS, seed: int = 0) -> list[tuple[list[TableSpec], int]]:
    """``count`` random ``(tables, batch)`` sets (1 to 64 tables, 20 to 200k rows), their
    weights capped by a log-uniform budget so the per-table and per-weight terms separate."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(count):
        n = int(rng.choice([1, 2, 4, 8, 16, 32, 64]))
        tables: list[TableSpec] = []
        for i in range(n):
            rows = int(np.exp(rng.uniform(np.log(20), np.log(200_000))))
            dim = int(rng.choice([4, 8, 16, 32, 64, 128]))
            pf = round(float(np.exp(rng.uniform(0.0, np.log(30)))), 2)
            tables.append(TableSpec(name=f"dense{s}_{i}", rows=rows, dim=dim, pooling_factor=pf))
        budget = np.exp(rng.uniform(np.log(10_000), np.log(_MAX_WEIGHT_ELEMENTS)))
        while sum(t.rows * t.dim for t in tables) > budget and max(t.rows for t in tables) > 20:
            big = max(range(n), key=lambda i: (tables[i].rows > 20, tables[i].rows * tables[i].dim))
            t = tables[big]
            tables[big] = TableSpec(
                name=t.name, rows=max(20, t.rows // 4), dim=t.dim, pooling_factor=t.pooling_factor
            )
        out.append((tables, int(rng.choice([128, 512, 2048]))))
    return out


@group_task
def _group_dense_times(group: JobGroup) -> list[tuple[int, float, float]]:
    device = "cuda" if group.device.type == "cuda" else "cpu"
    sets = list(enumerate(random_dense_sets()))
    return [(i, *time_dense_kernel(t, b, device)) for i, (t, b) in my_share(sets, group)]


def time_dense_sets(device: str = "cpu") -> list[tuple[list[TableSpec], int, float, float]]:
    """``(tables, batch, fwd_ms, bwd_ms)`` of :func:`random_dense_sets` (shared over a job's
    ranks while one drives)."""
    check_may_measure("time_dense_sets")
    sets = random_dense_sets()
    group = active_group()
    if group is not None:
        timed = sorted(t for share in run_on_group(_group_dense_times) for t in share)
        return [(*sets[i], fwd, bwd) for i, fwd, bwd in timed]
    return [(t, b, *time_dense_kernel(t, b, device)) for t, b in sets]
