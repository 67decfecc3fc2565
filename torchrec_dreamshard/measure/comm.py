"""The all-to-all of pooled embeddings under table-wise sharding, timed and modelled.

Forward: every device holds the pooled outputs ``[B, dims_d]`` of its tables for the whole
batch and sends device ``j`` its slice of the batch (``B_j`` samples); it receives
``[B_d, dims_i]`` from every device ``i``. Backward: the gradients go back the same way.
Both are one ``all_to_all_single`` over the flattened outputs, as TorchRec does.

The local backend has a single process and cannot run a collective, so it uses a model
fitted to real ``all_to_all_single`` timings taken on this machine (gloo over loopback):

    t(D, v) = a + b * (D - 1) + c * v        (ms, one all-to-all; v = MB a device sends
                                              plus receives, its own slice excluded)

and a device's communication is ``t`` for the forward plus ``t`` for the backward (the
backward moves the same volume). ``a, b, c`` are least squares over timings on 2..4 ranks
and random widths, clipped at 0; they are cached in a JSON file per machine.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchrec_dreamshard.measure.hardware import cpu_name
from torchrec_dreamshard.measure.job_group import active_group
from torchrec_dreamshard.measure.machine_cache import load_cached, machine_cache_path
from torchrec_dreamshard.measure.spawn import (
    check_may_spawn,
    free_port,
    launcher_free_env,
    local_process_group,
    measuring_ranks,
)

_CALIBRATION_BATCHES = (512, 2048, 8192)
_CALIBRATION_REPEATS = 5


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
# The fitted model
# ----------------------------------------------------------------------------------------


@dataclass
class CommModel:
    """``t(D, MB) = latency_ms + per_peer_ms * (D - 1) + ms_per_mb * MB`` per all-to-all.

    Args:
        latency_ms: fixed cost of one all-to-all.
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
        (the same latency-bandwidth form fits every collective; see
        :mod:`torchrec_dreamshard.measure.collectives`)."""
        if num_devices <= 1:
            return 0.0
        return self.latency_ms + self.per_peer_ms * (num_devices - 1) + self.ms_per_mb * megabytes

    def all_to_all_ms(self, num_devices: int, megabytes: float) -> float:
        """One all-to-all's ms for a device moving ``megabytes`` among ``num_devices``."""
        return self.collective_ms(num_devices, megabytes)

    def device_comm_ms(self, dims: Sequence[int], batch_size: int, elem_bytes: int = 4) -> list:
        """Forward + backward all-to-all ms of every device, given each device's width."""
        d = len(dims)
        return [
            2 * self.all_to_all_ms(d, a2a_megabytes(dims, batch_size, r, elem_bytes))
            for r in range(d)
        ]


def fit_comm_model(
    samples: Sequence[tuple[int, float, float]], source: str, what: str = "all-to-all"
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


def _calibration_worker(rank: int, world: int, port: int, out_path: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    samples = []
    with local_process_group(rank, world, port):
        for d in range(2, world + 1):
            group = dist.new_group(list(range(d)))
            for batch in _CALIBRATION_BATCHES:
                dims = [int(x) for x in rng.choice([0, 64, 256, 512, 1024], size=d)]
                if rank >= d:
                    continue
                times = time_all_to_all(dims, batch, _CALIBRATION_REPEATS, group=group)
                mb = a2a_megabytes(dims, batch, rank)
                samples.append((d, mb, statistics.median(times) / 2))
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(samples, gathered, dst=0)
        if rank == 0:
            flat = [s for part in gathered for s in part]
            Path(out_path).write_text(json.dumps(flat))


def calibrate_comm_model(max_devices: int = 4) -> CommModel:
    """Time real gloo all-to-alls on 2..``max_devices`` spawned ranks (at most the
    machine's cores; a clean environment) and fit the model.

    Takes a few seconds (most of it starting the processes).

    Raises:
        ValueError: called from inside a distributed job, or ``max_devices < 2``.
    """
    import tempfile

    import torch.multiprocessing as mp

    check_may_spawn("timing the all-to-all")
    if max_devices < 2:
        raise ValueError(f"max_devices must be >= 2, got {max_devices}")
    max_devices = measuring_ranks(max_devices)
    with tempfile.TemporaryDirectory() as tmp, launcher_free_env():
        out = os.path.join(tmp, "samples.json")
        mp.spawn(_calibration_worker, args=(max_devices, free_port(), out), nprocs=max_devices)
        samples = json.loads(Path(out).read_text())
    source = f"gloo all_to_all_single on {cpu_name()}, 2..{max_devices} ranks"
    return fit_comm_model([tuple(s) for s in samples], source)


def default_model_path() -> Path:
    """Per-machine cache file of the fitted model
    (:func:`~torchrec_dreamshard.measure.machine_cache.machine_cache_path`)."""
    return machine_cache_path("comm_model", cpu_name())


_LOADED: dict[str, CommModel] = {}


def _parse(data: Any) -> CommModel:
    try:
        return CommModel(**data)
    except TypeError as exc:
        raise ValueError(f"unreadable ({exc})") from None


def load_comm_model(path: str | os.PathLike | None = None) -> CommModel:
    """The fitted model from ``path`` (default :func:`default_model_path`), calibrating and
    saving it first when the file does not exist. Without ``path``, while rank 0 of a job
    drives measurements on the job's group, the all-to-all measured on that group
    (:func:`~torchrec_dreamshard.measure.collectives.load_group_collectives`)."""
    if path is None:
        group = active_group()
        if group is not None:
            from torchrec_dreamshard.measure.collectives import load_group_collectives

            return load_group_collectives(group).models["all_to_all"]
    path = Path(path) if path is not None else default_model_path()
    return load_cached(
        path, "comm model file", _parse, lambda: calibrate_comm_model(), asdict, _LOADED
    )
