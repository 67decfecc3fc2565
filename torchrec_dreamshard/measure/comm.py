"""The all-to-all of pooled embeddings under table-wise sharding, and the model of a
collective's time.

Forward: every device holds the pooled outputs ``[B, dims_d]`` of its tables for the whole
batch and sends device ``j`` its slice of the batch (``B_j`` samples); it receives
``[B_d, dims_i]`` from every device ``i``. Backward: the gradients go back the same way.
Both are one ``all_to_all_single`` over the flattened outputs, as TorchRec does.

Every collective's time is modelled (:class:`CommModel`) as

    t(D, v) = a + b * (D - 1) + c * v        (ms, one collective; v = MB a device sends
                                              plus receives, its own slice excluded)

with ``a, b, c`` least squares over timings, clipped at 0 (:func:`fit_comm_model`). A
device's communication under table-wise sharding is ``t`` for the forward all-to-all plus
``t`` for the backward (the same volume). Where the timings are taken and cached (this
machine's ranks as threads, or a job's own group) is :mod:`torchrec_dreamshard.measure.collectives`:
the local backend, the calibration and the planner all price the all-to-all with the one
model fitted there (:func:`~torchrec_dreamshard.measure.collectives.load_all_to_all_model`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


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


def a2a_megabytes(dims: Sequence[int], batch_size: int, rank: int, elem_bytes: int = 4) -> float:
    """MB ``rank`` sends plus receives in one all-to-all, its own slice excluded."""
    send, recv = a2a_splits(dims, batch_size, rank)
    own = send[rank] + recv[rank]
    return (sum(send) + sum(recv) - own) * elem_bytes / 1e6


def time_all_to_all(
    dims: Sequence[int],
    batch_size: int,
    iters: int,
    warmup: int = 1,
    group=None,
    device: torch.device | None = None,
) -> list[float]:
    """Time the forward and backward all-to-all on an initialised process group.

    Every rank of ``group`` must call it with the same ``dims``. Each all-to-all starts
    after a barrier, so a rank's time is from the common start to its own completion.

    Returns:
        ``iters`` figures of forward + backward ms for this rank.
    """
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


# ----------------------------------------------------------------------------------------
# The model of a collective's time
# ----------------------------------------------------------------------------------------


@dataclass
class CommModel:
    """``t(D, MB) = latency_ms + per_peer_ms * (D - 1) + ms_per_mb * MB`` per collective.

    Args:
        latency_ms: fixed cost of one collective.
        per_peer_ms: extra cost per other device.
        ms_per_mb: cost per MB a device sends plus receives.
        source: how the constants were obtained.
        samples: timings the fit used.
        rmse_ms: root mean square error of the fit on them.
    """

    latency_ms: float
    per_peer_ms: float
    ms_per_mb: float
    source: str = ""
    samples: int = 0
    rmse_ms: float = 0.0

    def collective_ms(self, num_devices: int, megabytes: float) -> float:
        """One collective's ms for a device moving ``megabytes`` among ``num_devices``
        (0 for one device)."""
        if num_devices <= 1:
            return 0.0
        return self.latency_ms + self.per_peer_ms * (num_devices - 1) + self.ms_per_mb * megabytes

    def device_comm_ms(self, dims: Sequence[int], batch_size: int, elem_bytes: int = 4) -> list:
        """Forward + backward table-wise all-to-all ms of every device, given each
        device's pooled width (this model being the all-to-all's)."""
        d = len(dims)
        return [
            2 * self.collective_ms(d, a2a_megabytes(dims, batch_size, r, elem_bytes))
            for r in range(d)
        ]


def fit_comm_model(
    samples: Sequence[tuple[int, float, float]], source: str, what: str = "collective"
) -> CommModel:
    """Least squares of ``(num_devices, MB, ms)`` samples (one ``what`` collective each).

    Where every sample has the same ``num_devices`` (a job's own group, or a 2-core
    machine's two ranks) the per-peer term cannot be told from the latency: it is 0, and
    the model holds at that size."""
    arr = np.asarray(samples, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 3:
        raise ValueError(f"fitting the {what} model needs at least 3 samples")
    design = np.stack([np.ones(len(arr)), arr[:, 0] - 1, arr[:, 1]], axis=1)
    if np.all(arr[:, 0] == arr[0, 0]):
        design[:, 1] = 0.0
    coef, *_ = np.linalg.lstsq(design, arr[:, 2], rcond=None)
    coef = np.maximum(coef, 0.0)
    rmse = float(np.sqrt(np.mean((design @ coef - arr[:, 2]) ** 2)))
    return CommModel(*(float(c) for c in coef), source=source, samples=len(arr), rmse_ms=rmse)
