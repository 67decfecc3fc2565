"""The distributed backend: one rank per device times its fused kernel, the reference kernel
and the real all-to-all, in a process group or on a pool of spawned gloo ranks."""

from __future__ import annotations

import atexit
import queue
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from torchrec_dreamshard.data.tasks import Task, device_tables
from torchrec_dreamshard.measure.comm import time_all_to_all
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.embedding_kernels import (
    Arena,
    FusedKernel,
    reference_kernel,
    reference_numel,
    state_numel,
)
from torchrec_dreamshard.measure.measurements import PlacementMeasurement
from torchrec_dreamshard.measure.summary import summarise
from torchrec_dreamshard.ranks.spawn import free_port, local_process_group
from torchrec_dreamshard.threads import single_thread

_RESULT_TIMEOUT_S = 1800.0
_OOM_ERRORS = (RuntimeError, MemoryError)


class _Shard:
    """A rank's kernels; errors are kept, not raised, so no peer waits forever."""

    def __init__(self, tables, batch_size: int, config: MeasureConfig) -> None:
        self.config = config
        self.error: str | None = None
        self.kernel = self.ref = None
        self.arena = Arena()
        try:
            if config.device == "cpu":
                self.arena.reserve(
                    sum(state_numel(tables, config.optimizer)) + reference_numel(config)
                )
            if tables:
                self.kernel = FusedKernel(tables, batch_size, config, self.arena)
            self.ref = reference_kernel(config, self.arena)
        except _OOM_ERRORS as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def time_round(self, first: bool) -> tuple[float, float, float]:
        """``(fwd_ms, bwd_ms, reference_ms)`` of one round (zeros after an error)."""
        if self.error is not None:
            return 0.0, 0.0, 0.0
        warmup = self.config.warmup if first else min(1, self.config.warmup)
        try:
            fwd = bwd = 0.0
            if self.kernel is not None:
                fwd, bwd = self.kernel.run_round(warmup, self.config.iters)
            ref = sum(self.ref.run_round(warmup, self.config.iters))
            return fwd, bwd, ref
        except _OOM_ERRORS as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            return 0.0, 0.0, 0.0


def measure_rank(
    task: Task, placement: Sequence[int], config: MeasureConfig | None = None
) -> PlacementMeasurement | None:
    """Measure a placement in a process group of ``task.num_devices`` ranks (all call it).

    Returns:
        The measurement on rank 0, ``None`` on the others.
    """
    import torch.distributed as dist

    config = config or MeasureConfig()
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != task.num_devices:
        raise ValueError(
            f"the process group has {world} ranks but the task has {task.num_devices} devices"
        )
    start = time.perf_counter()
    groups = device_tables(task, placement)
    mine = [task.tables[i] for i in groups[rank]]
    dims = [sum(task.tables[i].dim for i in g) for g in groups]
    device = torch.device("cuda", torch.cuda.current_device()) if config.device == "cuda" else None
    with single_thread(config.device == "cpu"):
        shard = _Shard(mine, task.batch_size, config)
        rows = [
            _one_round(shard, dims, task.batch_size, config, r == 0, device)
            for r in range(config.rounds)
        ]
    gathered: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object({"rows": rows, "error": shard.error}, gathered, dst=0)
    if rank != 0:
        return None
    return _assemble(gathered, [len(g) for g in groups], dims, config, start)


def _one_round(shard, dims, batch_size, config, first, device) -> tuple[float, ...]:
    import torch.distributed as dist

    if config.in_turn:
        result = (0.0, 0.0, 0.0)
        for turn in range(dist.get_world_size()):
            if turn == dist.get_rank():
                result = shard.time_round(first)
            dist.barrier()
    else:
        dist.barrier()
        result = shard.time_round(first)
    warmup = 1 if first else 0
    comm = time_all_to_all(dims, batch_size, config.iters, warmup, device=device)
    return (*result, float(np.median(comm)))


def _assemble(gathered, num_tables, dims, config, start) -> PlacementMeasurement:
    errors = [f"rank {r}: {g['error']}" for r, g in enumerate(gathered) if g["error"]]
    if errors:
        return PlacementMeasurement.failed("; ".join(errors), "distributed")
    arr = np.asarray([g["rows"] for g in gathered], dtype=np.float64)  # [D, rounds, 4]
    arr = arr.transpose(1, 0, 2)  # [rounds, D, 4]
    backend = "nccl" if config.device == "cuda" else "gloo"
    return summarise(
        compute=arr[:, :, :2],
        comm=arr[:, :, 3],
        reference=np.median(arr[:, :, 2], axis=1),
        num_tables=num_tables,
        backend="distributed",
        comm_source=f"measured: {backend} all_to_all_single, {len(dims)} ranks",
        wall_s=time.perf_counter() - start,
    )


def _pool_worker(rank: int, world: int, port: int, jobs, results) -> None:
    with local_process_group(rank, world, port):
        while True:
            job = jobs[rank].get()
            if job is None:
                break
            task = Task.from_dict(job["task"])
            config = MeasureConfig(**job["config"])
            try:
                out = measure_rank(task, job["placement"], config)
            except Exception as exc:  # reported to the parent, which raises it
                out = PlacementMeasurement.failed(f"{type(exc).__name__}: {exc}", "distributed")
                out.extra["exception"] = True
            if rank == 0:
                results.put(out.to_dict())


class RankPool:
    """``world_size`` spawned gloo ranks that measure placements (of that many devices)."""

    def __init__(self, world_size: int) -> None:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.world_size = world_size
        self.jobs = [ctx.Queue() for _ in range(world_size)]
        self.results = ctx.Queue()
        port = free_port()
        self.procs = [
            ctx.Process(
                target=_pool_worker,
                args=(r, world_size, port, self.jobs, self.results),
                daemon=True,
            )
            for r in range(world_size)
        ]
        for p in self.procs:
            p.start()

    def measure(
        self, task: Task, placement: Sequence[int], config: MeasureConfig
    ) -> PlacementMeasurement:
        """Measure one placement on the pool's ranks."""
        job = {"task": task.to_dict(), "placement": list(placement), "config": config.to_dict()}
        for q in self.jobs:
            q.put(job)
        deadline = time.monotonic() + _RESULT_TIMEOUT_S
        while True:
            try:
                out = PlacementMeasurement.from_dict(self.results.get(timeout=1.0))
                break
            except queue.Empty:
                dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    self.close()
                    why = f"ranks {dead} died" if dead else "timed out"
                    return PlacementMeasurement.failed(
                        f"distributed measurement {why}", "distributed"
                    )
        if out.extra.pop("exception", False):
            raise RuntimeError(f"distributed measurement raised: {out.error}")
        return out

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def close(self) -> None:
        """Stop the ranks (politely, then by force)."""
        for q in self.jobs:
            try:
                q.put(None)
            except (ValueError, OSError):
                pass
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


_POOLS: dict[int, RankPool] = {}


def measure_distributed(
    task: Task, placement: Sequence[int], config: MeasureConfig | None = None
) -> PlacementMeasurement:
    """Measure with one rank per device: in the initialised process group (every rank gets
    rank 0's result), else on spawned gloo ranks (CPU only)."""
    import torch.distributed as dist

    config = config or MeasureConfig()
    if dist.is_available() and dist.is_initialized():
        out = measure_rank(task, placement, config)
        box = [out.to_dict() if out is not None else None]
        dist.broadcast_object_list(box, src=0)
        return PlacementMeasurement.from_dict(box[0])
    if config.device != "cpu":
        raise ValueError(
            "spawned distributed measurement runs gloo on CPU; for CUDA launch with torchrun "
            "(python -m torchrec_dreamshard.cli.torchrun_measure)"
        )
    pool = _POOLS.get(task.num_devices)
    if pool is None or not pool.alive():
        pool = _POOLS[task.num_devices] = RankPool(task.num_devices)
    return pool.measure(task, placement, config)


def close_pools() -> None:
    """Stop every spawned rank pool."""
    while _POOLS:
        _, pool = _POOLS.popitem()
        pool.close()


atexit.register(close_pools)
