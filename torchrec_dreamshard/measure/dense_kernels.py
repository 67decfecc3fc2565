"""The kernel data-parallel tables run, timed on this machine and modelled.

TorchRec's data-parallel sharding looks a table up on every rank with FBGEMM's *dense*
table-batched kernel (``DenseTableBatchedEmbeddingBagsCodegen``: no fused optimizer; its
backward writes a dense gradient of the whole table), DDP all-reduces that gradient and
the job's dense optimizer updates the table. That is not the fused kernel the cost network
learnt: on this machine's CPU, the fused row-wise Adagrad backward of a tiny table costs
several times the dense kernel's backward and update. So data-parallel tables are priced
by a model of their own kernel, fitted here as the collectives are:

    fwd = a0 + a1 n + a2 G + a3 O
    bwd = c0 + c1 n + c2 G + c3 W            (ms; the dense optimizer step included)

over the tables one rank looks up in one dense kernel: ``n`` tables, ``G = b sum p d``
elements gathered (MB of fp32), ``O = b sum d`` outputs written, ``W = sum R d`` weights
(the gradient zeroed and written, the optimizer's passes over weights, state and
gradient). The coefficients are non-negative least squares over timings of random table
sets (FBGEMM's dense kernel forward and backward, then ``torch.optim.Adagrad`` over the
weights, as TorchRec's DP exposes them), cached per machine in a JSON file. On CUDA the
timer runs on the GPU (events); that path is written to be right and is unmeasured here.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.measure.embedding_kernels import fused_ring
from torchrec_dreamshard.measure.hardware import device_name
from torchrec_dreamshard.measure.job_group import (
    JobGroup,
    active_group,
    group_task,
    my_share,
    run_on_group,
)
from torchrec_dreamshard.measure.machine_cache import load_cached, machine_cache_path
from torchrec_dreamshard.measure.spent import spent_on
from torchrec_dreamshard.threads import single_thread

FORMAT_VERSION = 1  # of the cache file; a reader refuses other versions
FEATURES = ("ms", "ms_per_table", "ms_per_mb_gathered", "ms_per_mb_output", "ms_per_mb_weights")
_FIT_SETS = 28  # random table sets timed to fit the model
_MAX_WEIGHT_ELEMENTS = 8_000_000  # per timed set (32 MB of fp32)
_WARMUP, _ITERS = 2, 5
_LEARNING_RATE = 0.01


def dense_features(tables: Sequence[TableSpec], batch_size: int) -> np.ndarray:
    """``[1, n, G, O, W]`` of one dense kernel (see the module docstring; MB of fp32)."""
    gathered = batch_size * sum(t.pooling_factor * t.dim for t in tables) * 4 / 1e6
    outputs = batch_size * sum(t.dim for t in tables) * 4 / 1e6
    weights = sum(t.rows * t.dim for t in tables) * 4 / 1e6
    return np.array([1.0, len(tables), gathered, outputs, weights])


@dataclass
class DenseKernelModel:
    """The fitted dense-kernel model (see the module docstring).

    Args:
        fwd: the forward's coefficients, in the order of :data:`FEATURES`.
        bwd: the backward's (dense optimizer step included), same order.
        device: ``"cpu"`` or ``"cuda"``.
        source: how it was obtained.
        samples: timed sets it was fitted on.
        mape: mean absolute relative error of fwd + bwd over them (``None``: not fitted).
    """

    fwd: tuple[float, ...]
    bwd: tuple[float, ...]
    device: str = "cpu"
    source: str = ""
    samples: int = 0
    mape: float | None = None
    version: int = field(default=FORMAT_VERSION)

    def __post_init__(self) -> None:
        for name in ("fwd", "bwd"):
            coef = tuple(float(x) for x in getattr(self, name))
            if len(coef) != len(FEATURES) or not all(x >= 0 for x in coef):
                raise ValueError(
                    f"dense kernel model {name} needs {len(FEATURES)} coefficients >= 0 "
                    f"({', '.join(FEATURES)}), got {getattr(self, name)!r}"
                )
            setattr(self, name, coef)

    def ms(self, tables: Sequence[TableSpec], batch_size: int) -> tuple[float, float]:
        """``(fwd_ms, bwd_ms)`` of one dense kernel over ``tables`` at ``batch_size``."""
        if not tables:
            return 0.0, 0.0
        x = dense_features(tables, batch_size)
        return float(np.dot(self.fwd, x)), float(np.dot(self.bwd, x))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> DenseKernelModel:
        if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
            found = data.get("version") if isinstance(data, dict) else type(data).__name__
            raise ValueError(
                f"dense kernel model needs format version {FORMAT_VERSION}, got {found}"
            )
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(f"dense kernel model is malformed ({exc})") from None


# ----------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------


def time_dense_kernel(
    tables: Sequence[TableSpec], batch_size: int, device: str = "cpu", seed: int = 0
) -> tuple[float, float]:
    """Median ``(fwd_ms, bwd_ms)`` of FBGEMM's dense kernel over ``tables`` (one thread on
    CPU), the backward followed by an Adagrad step over the weights and zeroing the grad."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        DenseTableBatchedEmbeddingBagsCodegen,
    )

    dev = torch.device(device)
    with single_thread(device == "cpu"):
        emb = DenseTableBatchedEmbeddingBagsCodegen(
            [(t.rows, t.dim) for t in tables], use_cpu=device == "cpu"
        ).to(dev)
        with torch.no_grad():
            emb.weights.uniform_(0.001, 0.01)
        optimizer = torch.optim.Adagrad(emb.parameters(), lr=_LEARNING_RATE)
        ring = [(i.to(dev), o.to(dev)) for i, o in fused_ring(tables, batch_size, seed, 3)]
        grad = torch.randn(batch_size, sum(t.dim for t in tables), device=dev)
        times = []
        for k in range(_WARMUP + _ITERS):
            fb = _dense_step(emb, optimizer, ring[k % len(ring)], grad, dev)
            if k >= _WARMUP:
                times.append(fb)
    return statistics.median(f for f, _ in times), statistics.median(b for _, b in times)


def _dense_step(emb, optimizer, batch, grad, dev: torch.device) -> tuple[float, float]:
    def now() -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter()

    ids, offsets = batch
    t0 = now()
    out = emb(ids, offsets)
    t1 = now()
    out.backward(grad)
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
    t2 = now()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3


def random_dense_sets(count: int = _FIT_SETS, seed: int = 0) -> list[tuple[list[TableSpec], int]]:
    """``count`` random ``(tables, batch)`` sets spanning tiny to medium tables (1 to 64
    tables, 20 to 200k rows, dims 4 to 128, 1 to 30 ids per sample, batch 128 to 2048),
    the biggest tables shrunk until the set's weights are within a budget drawn
    log-uniformly from 10k to 8M elements (so that many tables come with few weights too,
    and the per-table and per-weight terms can be told apart)."""
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


def nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares of *relative* errors (each row weighted by ``1 / y``, so that tiny
    kernels, where data-parallel is chosen, count as much as big ones) with every
    coefficient ``>= 0``: columns whose coefficient comes out negative are dropped (the
    most negative first) and the rest refitted."""
    w = 1.0 / np.maximum(y, 1e-3)
    x, y = x * w[:, None], y * w
    keep = list(range(x.shape[1]))
    while True:
        coef = np.zeros(x.shape[1])
        coef[keep] = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
        worst = min(keep, key=lambda j: coef[j])
        if coef[worst] >= 0:
            return coef
        keep.remove(worst)


def fit_dense_kernel_model(
    samples: Sequence[tuple[Sequence[TableSpec], int, float, float]], device: str, source: str
) -> DenseKernelModel:
    """The model from ``(tables, batch, fwd_ms, bwd_ms)`` timings."""
    if len(samples) < len(FEATURES):
        raise ValueError(f"fitting needs at least {len(FEATURES)} timed sets, got {len(samples)}")
    x = np.stack([dense_features(tables, b) for tables, b, _, _ in samples])
    fwd = nonnegative_lstsq(x, np.array([s[2] for s in samples]))
    bwd = nonnegative_lstsq(x, np.array([s[3] for s in samples]))
    total = np.array([s[2] + s[3] for s in samples])
    mape = float(np.mean(np.abs(x @ fwd + x @ bwd - total) / total))
    return DenseKernelModel(
        tuple(fwd), tuple(bwd), device=device, source=source, samples=len(samples), mape=mape
    )


@group_task
def _group_dense_times(group: JobGroup) -> list[tuple[int, float, float]]:
    """``(set index, fwd_ms, bwd_ms)`` of this rank's share of :func:`random_dense_sets`."""
    device = "cuda" if group.device.type == "cuda" else "cpu"
    sets = list(enumerate(random_dense_sets()))
    return [(i, *time_dense_kernel(t, b, device)) for i, (t, b) in my_share(sets, group)]


@spent_on("dense_kernel")
def calibrate_dense_kernel_model(device: str = "cpu") -> DenseKernelModel:
    """Time :func:`random_dense_sets` on this machine and fit the model (a few seconds);
    while rank 0 of a job drives measurements on its group, every rank times its share."""
    sets = random_dense_sets()
    group = active_group()
    if group is not None:
        timed = sorted(t for share in run_on_group(_group_dense_times) for t in share)
        samples = [(*sets[i], fwd, bwd) for i, fwd, bwd in timed]
    else:
        samples = [(t, b, *time_dense_kernel(t, b, device)) for t, b in sets]
    name = device_name(device)
    return fit_dense_kernel_model(samples, device, f"FBGEMM dense kernel + Adagrad on {name}")


# ----------------------------------------------------------------------------------------
# The per-machine cache
# ----------------------------------------------------------------------------------------


def default_dense_kernel_path(device: str = "cpu") -> Path:
    """Per-machine cache file of the fitted model
    (:func:`~torchrec_dreamshard.measure.machine_cache.machine_cache_path`)."""
    return machine_cache_path(f"dense_kernel_{device}", device_name(device))


_LOADED: dict[str, DenseKernelModel] = {}


def load_dense_kernel_model(
    path: str | os.PathLike | None = None, device: str = "cpu"
) -> DenseKernelModel:
    """The fitted model from ``path`` (default :func:`default_dense_kernel_path`),
    timing and saving it first when the file does not exist."""
    path = Path(path) if path is not None else default_dense_kernel_path(device)
    return load_cached(
        path,
        "dense kernel model file",
        DenseKernelModel.from_dict,
        lambda: calibrate_dense_kernel_model(device),
        DenseKernelModel.to_dict,
        _LOADED,
    )
