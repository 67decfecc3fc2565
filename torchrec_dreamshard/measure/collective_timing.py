"""The collectives timed: buffers sized per collective, runs timed from a common start, on
groups of ranks that are threads of this process or spawned processes."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchrec_dreamshard.measure.gate import check_may_measure
from torchrec_dreamshard.ranks.spawn import (
    check_may_spawn,
    free_port,
    launcher_free_env,
    local_process_group,
)
from torchrec_dreamshard.ranks.torch_compat import (
    flat_all_gather,
    flat_reduce_scatter,
    loopback_gloo_group,
)

COLLECTIVES = ("all_to_all", "reduce_scatter", "all_gather", "all_reduce")
_WIRE_FACTOR = {"all_to_all": 2.0, "reduce_scatter": 2.0, "all_gather": 2.0, "all_reduce": 4.0}
CALIBRATION_BYTES = (2**14, 2**17, 2**20, 2**22)  # buffer bytes per rank: 16 KB .. 4 MB
# interleaved passes and the lower quartile: a CPU's runs are bimodal (docs/design_notes.md)
PASSES = 6
REPEATS_PER_PASS = 4
STEADY_QUANTILE = 0.25


def check_kind(kind: str) -> str:
    """``kind`` if it names a collective, else a ``ValueError`` listing the names."""
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective {kind!r}; expected one of {list(COLLECTIVES)}")
    return kind


def wire_megabytes(kind: str, num_devices: int, buffer_bytes: float) -> float:
    """MB one rank sends plus receives in ``kind``'s bandwidth-optimal algorithm over
    ``num_devices`` ranks, ``buffer_bytes`` per rank (0 for one rank)."""
    check_kind(kind)
    if num_devices <= 1:
        return 0.0
    return _WIRE_FACTOR[kind] * (num_devices - 1) / num_devices * buffer_bytes / 1e6


def _buffers(
    kind: str, numel: int, num_devices: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input, output)`` of ``kind`` for ``numel`` elements per rank (all-reduce in place)."""
    part = numel // num_devices
    if kind == "reduce_scatter":
        return torch.rand(numel, device=device), torch.empty(part, device=device)
    if kind == "all_gather":
        return torch.rand(part, device=device), torch.empty(numel, device=device)
    full = torch.rand(numel, device=device)
    return full, (torch.empty(numel, device=device) if kind == "all_to_all" else full)


def _run(kind: str, inp: torch.Tensor, out: torch.Tensor, group) -> None:
    import torch.distributed as dist

    if kind == "all_to_all":
        dist.all_to_all_single(out, inp, group=group)
    elif kind == "reduce_scatter":
        getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(out, inp, group=group)
    elif kind == "all_gather":
        getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(out, inp, group=group)
    else:
        dist.all_reduce(inp, group=group)


def time_collective(
    kind: str, buffer_bytes: int, iters: int, warmup: int = 1, group=None, device=None
) -> list[float]:
    """``iters`` ms of ``kind`` with about ``buffer_bytes`` per rank (fp32), each run from a
    barrier to this rank's completion; every rank of ``group`` calls it alike."""
    check_may_measure("time_collective")
    import torch.distributed as dist

    device = device or torch.device("cpu")
    d = dist.get_world_size(group)
    numel = max(1, round(buffer_bytes / 4 / d)) * d
    inp, out = _buffers(check_kind(kind), numel, d, device)
    times = []
    for i in range(warmup + iters):
        dist.barrier(group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        _run(kind, inp, out, group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def _calibration_worker(rank: int, world: int, port: int, out_path: str, backend: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    samples = []
    with local_process_group(rank, world, port, backend=backend):
        for d in range(2, world + 1):
            group = dist.new_group(list(range(d)))
            if rank >= d:
                continue
            samples += time_every_collective(group, d, device)
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(samples, gathered, dst=0)
        if rank == 0:
            Path(out_path).write_text(json.dumps([s for part in gathered for s in part]))


def runs_key() -> dict[str, Any]:
    """How a collective's figure is taken from its runs (part of the fitted models' cache key)."""
    return {"passes": PASSES, "runs_per_pass": REPEATS_PER_PASS, "quantile": STEADY_QUANTILE}


def steady_ms(times: Sequence[float]) -> float:
    """The lower quartile of one collective's runs."""
    if not times:
        raise ValueError("no collective runs to take a figure from")
    return float(np.quantile(np.asarray(times, dtype=np.float64), STEADY_QUANTILE))


def interleaved_samples(time_one: Callable[[str, int], list[float]], d: int) -> list[tuple]:
    """``(kind, D, MB, steady ms)`` of every collective and size on ``d`` ranks, in
    :data:`PASSES` passes of ``time_one(kind, buffer_bytes)``."""
    runs: dict[tuple[str, int], list[float]] = {}
    for _ in range(PASSES):
        for kind in COLLECTIVES:
            for size in CALIBRATION_BYTES:
                runs.setdefault((kind, size), []).extend(time_one(kind, size))
    return [
        (kind, d, wire_megabytes(kind, d, size), steady_ms(runs[kind, size]))
        for kind in COLLECTIVES
        for size in CALIBRATION_BYTES
    ]


def time_every_collective(group, d: int, device: torch.device) -> list[tuple]:
    """:func:`interleaved_samples` on this rank of ``group`` (``d`` ranks)."""
    return interleaved_samples(
        lambda kind, size: time_collective(
            kind, size, REPEATS_PER_PASS, group=group, device=device
        ),
        d,
    )


def spawned_samples(max_devices: int, backend: str) -> list[tuple]:
    """Every rank's samples of every group of 2..``max_devices`` spawned ranks."""
    import tempfile

    import torch.multiprocessing as mp

    check_may_spawn("timing the collectives")
    with tempfile.TemporaryDirectory() as tmp, launcher_free_env():
        out = os.path.join(tmp, "samples.json")
        args = (max_devices, free_port(), out, backend)
        mp.spawn(_calibration_worker, args=args, nprocs=max_devices)
        return [tuple(s) for s in json.loads(Path(out).read_text())]


_THREAD_TIMEOUT = timedelta(seconds=120)  # a rank that never joins fails the others


def thread_samples(max_devices: int) -> list[tuple]:
    """Every rank's samples of groups of 2..``max_devices`` gloo ranks run as threads."""
    import threading

    import torch.distributed as dist

    store = dist.HashStore()
    store.set_timeout(_THREAD_TIMEOUT)
    samples: list[tuple] = []
    for d in range(2, max_devices + 1):
        results: list[list[tuple] | BaseException | None] = [None] * d
        threads = [
            threading.Thread(
                target=_thread_rank,
                args=(dist.PrefixStore(f"collectives_{d}/", store), rank, d, results),
                name=f"dreamshard-collectives-{d}-{rank}",
                daemon=True,
            )
            for rank in range(d)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for rank, out in enumerate(results):
            if not isinstance(out, list):
                raise RuntimeError(
                    f"timing the gloo collectives on {d} ranks as threads: rank {rank} "
                    f"failed ({out!r})"
                ) from (out if isinstance(out, BaseException) else None)
            samples += out
    return samples


def _thread_rank(store: Any, rank: int, world: int, results: list) -> None:
    """One thread rank: its own gloo group on ``store``; samples or error in ``results[rank]``."""
    try:
        pg = loopback_gloo_group(store, rank, world, _THREAD_TIMEOUT)
        out = interleaved_samples(
            lambda kind, size: _time_on_backend(pg, kind, size, REPEATS_PER_PASS), world
        )
        pg.barrier().wait()  # no rank tears its group down while a peer still uses it
        results[rank] = out
    except BaseException as exc:  # raised by the thread that started the ranks
        results[rank] = exc


def _time_on_backend(pg: Any, kind: str, buffer_bytes: int, iters: int) -> list[float]:
    """:func:`time_collective` through an unregistered gloo backend's own methods."""
    d = pg.size()
    numel = max(1, round(buffer_bytes / 4 / d)) * d
    inp, out = _buffers(check_kind(kind), numel, d, torch.device("cpu"))
    run = {
        "all_to_all": lambda: pg.alltoall_base(out, inp, [], []),
        "reduce_scatter": lambda: flat_reduce_scatter(pg, out, inp),
        "all_gather": lambda: flat_all_gather(pg, out, inp),
        "all_reduce": lambda: pg.allreduce([inp]),
    }[kind]
    times = []
    for i in range(1 + iters):  # one warm-up
        pg.barrier().wait()
        t0 = time.perf_counter()
        run().wait()
        if i >= 1:
            times.append((time.perf_counter() - t0) * 1e3)
    return times
