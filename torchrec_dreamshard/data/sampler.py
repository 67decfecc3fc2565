"""The DreamShard-style task sampler: tasks from a table pool's train or test split."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task

DEFAULT_MEMORY_FACTOR = 1.5


def _as_range(value: int | tuple[int, int], what: str) -> tuple[int, int]:
    lo, hi = (value, value) if isinstance(value, int) else tuple(value)
    if not 1 <= lo <= hi:
        raise ValueError(f"{what} must be a positive int or (low, high) with low <= high")
    return int(lo), int(hi)


class TaskSampler:
    """Draws DreamShard-style tasks from a table pool split into train and test.

    Args:
        pool: the tables (e.g. :func:`synthetic_pool`).
        train_fraction: share of the pool in the train split; the rest is the test split.
        seed: seeds the split and every draw.
    """

    def __init__(self, pool: Sequence[TableSpec], train_fraction: float = 0.5, seed: int = 0):
        if not 0 < train_fraction < 1:
            raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
        if len(pool) < 2:
            raise ValueError("the pool needs at least 2 tables to split")
        self.rng = np.random.default_rng(seed)
        order = self.rng.permutation(len(pool))
        n_train = max(1, min(len(pool) - 1, int(round(train_fraction * len(pool)))))
        self.splits = {
            "train": [pool[i] for i in sorted(order[:n_train])],
            "test": [pool[i] for i in sorted(order[n_train:])],
        }

    def sample(
        self,
        split: str = "train",
        num_tables: int | tuple[int, int] = (20, 40),
        num_devices: int | Sequence[int] = (2, 4),
        batch_size: int = 2048,
        memory_factor: float = DEFAULT_MEMORY_FACTOR,
        rng: np.random.Generator | None = None,
    ) -> Task:
        """One task: T tables drawn without replacement from ``split``, D from
        ``num_devices`` (``rng``: ``None`` for the sampler's own generator)."""
        rng = self.rng if rng is None else rng
        if split not in self.splits:
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if memory_factor < 1:
            raise ValueError(f"memory_factor must be >= 1, got {memory_factor}")
        tables = self.splits[split]
        lo, hi = _as_range(num_tables, "num_tables")
        if hi > len(tables):
            raise ValueError(f"asked for up to {hi} tables but the {split} split has {len(tables)}")
        devices = [num_devices] if isinstance(num_devices, int) else list(num_devices)
        t = int(rng.integers(lo, hi + 1))
        d = int(rng.choice(devices))
        chosen = [tables[i] for i in sorted(rng.choice(len(tables), t, replace=False))]
        return make_task(chosen, d, batch_size, memory_factor)


def make_task(
    tables: Sequence[TableSpec],
    num_devices: int,
    batch_size: int,
    memory_factor: float = DEFAULT_MEMORY_FACTOR,
) -> Task:
    """A task whose devices each hold ``memory_factor`` times its bytes over D, and at
    least 1.05 times its largest table."""
    total = sum(t.size_bytes for t in tables)
    cap = max(memory_factor * total / num_devices, 1.05 * max(t.size_bytes for t in tables))
    return Task(
        tables=list(tables),
        num_devices=num_devices,
        memory_bytes=int(math.ceil(cap)),
        batch_size=batch_size,
    )
