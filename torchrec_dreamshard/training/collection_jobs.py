"""Collection jobs: which placements of which tasks a run measures, and measuring them (a job's
key is what the store records, so a resumed run skips what is measured)."""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from torchrec_dreamshard.cost.cost_net import single_thread
from torchrec_dreamshard.data.families import draw_task
from torchrec_dreamshard.data.tasks import Task, random_placement
from torchrec_dreamshard.policy import DreamShard
from torchrec_dreamshard.training.train_config import TrainConfig

if TYPE_CHECKING:
    from torchrec_dreamshard.store.cost_store import CostStore

JobKind = Literal["one", "random", "safe", "greedy", "sample"]
_TASK_MARK = "-task"  # keys of task jobs: f"{phase}-task{j}-{k}"


@dataclass(frozen=True)
class Job:
    """One placement to measure.

    Attributes:
        key: the store's job key, stable across runs (``"boot-single-3"``, ``"it2-task1-0"``).
        task: the task.
        kind: ``"one"`` (all on device 0), ``"random"``, ``"safe"``, ``"greedy"`` or ``"sample"``.
        seed: seeds a random placement or a sampled roll-out.
    """

    key: str
    task: Task
    kind: JobKind
    seed: int

    @property
    def phase(self) -> str:
        """``"boot"`` or ``"it<n>"``: the key prefix the store's ``done_jobs`` takes."""
        return self.key.split("-", 1)[0]


def job_seed(run_seed: int, key: str) -> int:
    """A job's seed: a function of the run's seed and the job key only."""
    return run_seed * 1000 + zlib.crc32(key.encode()) % 1000


def job_group(key: str) -> str:
    """The key without its placement index: one group per task (a bootstrap subset its own)."""
    return key.rsplit("-", 1)[0] if _TASK_MARK in key else key


def is_task_group(group: str) -> bool:
    """Whether a group holds the placements of a multi-device task."""
    return _TASK_MARK in group


def _job(cfg: TrainConfig, key: str, task: Task, kind: JobKind) -> Job:
    return Job(key=key, task=task, kind=kind, seed=job_seed(cfg.seed, key))


def _one_device(task: Task, idx: Sequence[int]) -> Task:
    """The tables ``idx`` of ``task`` fused on one device of just enough memory."""
    tables = [task.tables[i] for i in idx]
    memory = sum(t.size_bytes for t in tables)
    return Task(tables=tables, num_devices=1, memory_bytes=memory, batch_size=task.batch_size)


def bootstrap_jobs(cfg: TrainConfig) -> list[Job]:
    """The bootstrap: single tables and fused subsets on one device, and random placements
    of training tasks (deterministic in the config)."""
    rng = np.random.default_rng([cfg.seed, 7919])
    jobs = []
    n = max(cfg.boot_single, cfg.boot_subsets, cfg.boot_tasks)
    for j, task in enumerate(draw_tasks(cfg, n, rng)):
        if j < cfg.boot_single:
            one = _one_device(task, [int(rng.integers(len(task.tables)))])
            jobs.append(_job(cfg, f"boot-single-{j}", one, "one"))
        if j < cfg.boot_subsets and len(task.tables) > 1:
            size = int(rng.integers(2, min(60, len(task.tables)) + 1))
            idx = sorted(rng.choice(len(task.tables), size, replace=False).tolist())
            jobs.append(_job(cfg, f"boot-subset-{j}", _one_device(task, idx), "one"))
        if j < cfg.boot_tasks:
            for k in range(cfg.boot_placements):
                jobs.append(_job(cfg, f"boot-task{j}-{k}", task, "random"))
    return jobs


def draw_tasks(cfg: TrainConfig, n: int, rng: np.random.Generator) -> list[Task]:
    """``n`` training tasks from the configured families in turn, seeded by ``rng``."""
    seeds = rng.integers(2**31, size=n)
    fams = cfg.families
    return [
        draw_task(fams[k % len(fams)], "train", int(seed), cfg.num_tables, cfg.num_devices)
        for k, seed in enumerate(seeds)
    ]


def iteration_jobs(cfg: TrainConfig, it: int) -> list[Job]:
    """Iteration ``it``'s jobs: per task the safe plan, the greedy roll-out, sampled
    roll-outs and a random placement."""
    rng = np.random.default_rng([cfg.seed, it])
    last = cfg.placements_per_task - 1
    jobs = []
    for j, task in enumerate(draw_tasks(cfg, cfg.collect_tasks, rng)):
        for k in range(cfg.placements_per_task):
            kind: JobKind = (
                ("safe", "greedy")[k] if k < 2 else ("random" if k == last else "sample")
            )
            jobs.append(_job(cfg, f"it{it}-task{j}-{k}", task, kind))
    return jobs


def placement_for(agent: DreamShard, job: Job) -> list[int]:
    """The placement a job measures."""
    task = job.task
    if job.kind == "one":
        return [0] * len(task.tables)
    if job.kind == "random":
        return random_placement(task, job.seed)
    if job.kind == "safe":
        return agent.place(task, seed=job.seed)
    if job.kind == "greedy":
        return agent.place(task, mode="greedy")
    gen = torch.Generator().manual_seed(job.seed)
    with single_thread():
        return [int(d) for d in agent.mdp(task).rollout(agent.policy, 1, False, gen).placements[0]]


def collect(
    agent: DreamShard, jobs: Sequence[Job], store: CostStore, cfg: TrainConfig
) -> dict[str, float]:
    """Measure every job the store does not hold yet; returns collection metrics."""
    from torchrec_dreamshard.cost.collective_models import local_all_to_all
    from torchrec_dreamshard.measure import measure_placement

    mcfg = cfg.measure_config()
    phase = jobs[0].phase if jobs else ""
    done = store.done_jobs(phase, store.fingerprint(mcfg, cfg.backend))
    todo = [j for j in jobs if store_key(j) not in done]
    greedy_ms, start = [], time.perf_counter()
    for job in progress_bar(todo, cfg.progress, f"measure {phase}"):
        placement = placement_for(agent, job)
        comm = local_all_to_all(job.task.num_devices, cfg.backend, mcfg.comm_model_path)
        m = measure_placement(job.task, placement, mcfg, backend=cfg.backend, comm=comm)
        store.append(job.task, placement, m, mcfg, job=store_key(job))
        if job.kind == "safe" and m.ok:
            greedy_ms.append(m.step_ms)
    out = {"collect/measured": float(len(todo)), "collect/wall_s": time.perf_counter() - start}
    if greedy_ms:
        out["plan/cost_ms"] = float(np.mean(greedy_ms))
    return out


def store_key(job: Job) -> str:
    """A job's store key: its key and a hash of its task and kind."""
    from torchrec_dreamshard.measure.config import stable_key

    return f"{job.key}@{stable_key([job.task.to_dict(), job.kind], 10)}"


def progress_bar(items: Iterable, enabled: bool, desc: str) -> Iterable:
    """``items`` behind a tqdm bar when ``enabled``."""
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, leave=False)
