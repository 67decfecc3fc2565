"""The all-to-all of pooled embeddings under table-wise sharding: its splits and timing
(forward, device ``d`` sends ``j`` its outputs ``[B_j, dims_d]``; backward, the gradients)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from torchrec_dreamshard.measure.gate import check_may_measure


def local_batches(batch_size: int, num_devices: int) -> list[int]:
    """Samples of the batch each device receives (as even as possible)."""
    base, extra = divmod(batch_size, num_devices)
    return [base + (j < extra) for j in range(num_devices)]


def a2a_splits(dims: Sequence[int], batch_size: int, rank: int) -> tuple[list[int], list[int]]:
    """Forward ``(input_splits, output_splits)`` in elements for ``rank``.

    Args:
        dims: pooled width (sum of table dims) of every device.
        batch_size: the global batch.
        rank: this device.
    """
    local = local_batches(batch_size, len(dims))
    send = [local[j] * dims[rank] for j in range(len(dims))]
    recv = [local[rank] * dims[i] for i in range(len(dims))]
    return send, recv


def table_wise_flows(dims: Sequence[int], batch_size: int, elem_bytes: int = 4) -> np.ndarray:
    """``[D, D]`` bytes device ``i`` sends device ``j`` in the forward all-to-all (the
    backward's are the transpose), given every device's pooled width ``dims``."""
    local = np.asarray(local_batches(batch_size, len(dims)), dtype=np.float64)
    return np.outer(np.asarray(dims, dtype=np.float64), local) * elem_bytes


class AllToAllCost(Protocol):
    """What the local backend charges for the table-wise all-to-all (e.g. ``CommModel``).

    Attributes:
        source: how the model was obtained (recorded with the measurement).
    """

    source: str

    def device_comm_ms(
        self, dims: Sequence[int], batch_size: int, elem_bytes: int = 4
    ) -> list[float]:
        """Forward + backward all-to-all ms of every device, given its pooled width."""
        ...


def time_all_to_all(
    dims: Sequence[int],
    batch_size: int,
    iters: int,
    warmup: int = 1,
    group=None,
    device: torch.device | None = None,
) -> list[float]:
    """``iters`` forward + backward all-to-all ms for this rank, each from a barrier; every
    rank of ``group`` calls it with the same ``dims``."""
    check_may_measure("time_all_to_all")
    import torch.distributed as dist

    rank = dist.get_rank(group)
    device = device or torch.device("cpu")
    send, recv = a2a_splits(dims, batch_size, rank)
    fwd_in = torch.rand(sum(send), device=device)
    fwd_out = torch.empty(sum(recv), device=device)
    bwd_in = torch.rand(sum(recv), device=device)
    bwd_out = torch.empty(sum(send), device=device)
    times = []
    for i in range(warmup + iters):
        t = _timed_a2a(fwd_out, fwd_in, recv, send, group, device)
        t += _timed_a2a(bwd_out, bwd_in, send, recv, group, device)
        if i >= warmup:
            times.append(t)
    return times


def _timed_a2a(out, inp, out_splits, in_splits, group, device) -> float:
    import torch.distributed as dist

    dist.barrier(group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    dist.all_to_all_single(out, inp, out_splits, in_splits, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) * 1e3
