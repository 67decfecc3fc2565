"""The cost dataset a cost network starts from, drawn from the training families.

Three kinds of measurement, each a job with a stable key, so that a killed collection
resumes and a second run of the same settings measures nothing:

* ``fb-single-J``: one fresh table alone on one device (what fusion departs from);
* ``fb-group-J``: a random subset (2 to 60 tables) of a training task fused on one device
  (how a device's cost grows with its tables, sub- or super-additively);
* ``fb-task-J-K``: random placement ``K`` of a training task on its D devices (every
  device a fused group; the step cost; the all-to-all).

Tasks come from :data:`torchrec_dreamshard.families.TRAIN_FAMILIES` in turn, so the
network sees every access skew, memory level, table count and batch size training is
allowed to see, and none of the held-out families.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from torchrec_dreamshard.families import TRAIN_FAMILIES, draw_task
from torchrec_dreamshard.tasks import Task

JOB_PREFIX = "fb-"


@dataclass(frozen=True)
class BootstrapJob:
    """One measurement to take: its key, the task and the placement."""

    key: str
    task: Task
    placement: tuple[int, ...]


def _random_placement(task: Task, rng: np.random.Generator) -> tuple[int, ...]:
    """A uniformly random device with room for each table, largest first (any-fit)."""
    free = np.asarray(task.memory, dtype=np.int64)
    out = [0] * len(task.tables)
    for i in sorted(range(len(task.tables)), key=lambda i: -task.tables[i].size_bytes):
        legal = np.flatnonzero(free >= task.tables[i].size_bytes)
        d = int(rng.choice(legal))
        out[i] = d
        free[d] -= task.tables[i].size_bytes
    return tuple(out)


def _one_device(task: Task, idx) -> Task:
    tables = [task.tables[i] for i in idx]
    return Task(
        tables=tables,
        num_devices=1,
        memory_bytes=sum(t.size_bytes for t in tables),
        batch_size=task.batch_size,
    )


def bootstrap_jobs(
    singles: int, groups: int, tasks: int, placements_per_task: int = 2, seed: int = 0
) -> Iterator[BootstrapJob]:
    """The bootstrap's jobs, interleaved by kind (deterministic in every argument)."""
    rng = np.random.default_rng([seed, 4242])
    fams = list(TRAIN_FAMILIES)
    n = max(singles, groups, tasks)
    for j in range(n):
        fam = fams[j % len(fams)]
        task = draw_task(fam, "train", seed * 100_000 + j)
        if j < singles:
            i = int(rng.integers(len(task.tables)))
            yield BootstrapJob(f"{JOB_PREFIX}single-{j}", _one_device(task, [i]), (0,))
        if j < groups:
            size = int(rng.integers(2, min(60, len(task.tables)) + 1))
            idx = sorted(rng.choice(len(task.tables), size, replace=False).tolist())
            one = _one_device(task, idx)
            yield BootstrapJob(f"{JOB_PREFIX}group-{j}", one, (0,) * len(idx))
        if j < tasks:
            for k in range(placements_per_task):
                placement = _random_placement(task, rng)
                yield BootstrapJob(f"{JOB_PREFIX}task-{j}-{k}", task, placement)
