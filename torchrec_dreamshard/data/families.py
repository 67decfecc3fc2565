"""Task families: tasks that differ along the axes a real model can, for training on a mix
(:data:`TRAIN_FAMILIES`) and for judging whether a planner generalises
(:data:`HELDOUT_FAMILIES`). Draws are deterministic in ``(family, split, seed)``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from torchrec_dreamshard.data.sampler import TaskSampler, make_task
from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool
from torchrec_dreamshard.data.table_stats import hist_from_ids
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task

SPLITS = ("train", "test")
MAX_SIMULATED_IDS = 2_000_000  # ids drawn to estimate a Zipf table's reuse histogram


@dataclass(frozen=True, kw_only=True)
class Family:
    """How one family's tasks are drawn (ranges are ``(low, high)``, tuples the choices).

    Attributes:
        about: one line on how it differs from training.
        access: ``"pool"`` (the synthetic pool's split) or ``"zipf"`` (row ``r`` drawn with
            probability ``(r + 1)^-s / sum``, ``s`` in ``zipf``; ``(0, 0)``: uniform).
        rows, pooling: log-uniform ranges of rows per table and of the pooling factor.
        bag_cv: range of the bag-length coefficient of variation (``None``: not bursty).
        memory: device memory over the task's bytes / D.
        unequal: per-device memory spread, ``[1 - unequal, 1 + unequal]`` of the mean.
        tables, devices, batch: T's range, D and the global batch sizes.
    """

    name: str
    about: str
    access: str = "zipf"
    zipf: tuple[float, float] = (0.0, 1.3)
    rows: tuple[float, float] = (1e3, 4e5)
    dims: tuple[int, ...] = (8, 16, 32, 64, 128)
    pooling: tuple[float, float] = (1.0, 50.0)
    bag_cv: tuple[float, float] | None = None
    memory: tuple[float, ...] = (1.2, 1.5, 2.0)
    unequal: float = 0.0
    tables: tuple[int, int] = (20, 80)
    devices: tuple[int, ...] = (2, 4, 8)
    batch: tuple[int, ...] = (2048,)

    def __post_init__(self) -> None:
        if self.access not in ("pool", "zipf"):
            raise ValueError(f"family {self.name!r}: access must be 'pool' or 'zipf'")
        if min(self.memory) < 1.0:
            raise ValueError(f"family {self.name!r}: memory factors must be >= 1")
        if not 0 <= self.unequal < 1:
            raise ValueError(f"family {self.name!r}: unequal must be in [0, 1)")


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            name="pool",
            about="the DLRM-shaped pool's test tables at 1.5x memory (the training distribution)",
            access="pool",
            memory=(1.5,),
            tables=(20, 100),
        ),
        Family(name="zipf", about="Zipf access, exponent 0.5-1.3, memory 1.2-2x", zipf=(0.5, 1.3)),
        Family(name="uniform", about="uniform access (no skew)", zipf=(0.0, 0.0)),
        Family(
            name="tight",
            about="memory 1.05x and 1.2x the task's bytes / D",
            memory=(1.05, 1.2),
        ),
        Family(
            name="unequal",
            about="per-device memory from 0.6x to 1.4x the mean (mean 1.5x)",
            memory=(1.5,),
            unequal=0.4,
        ),
        Family(
            name="large",
            about="T 120-200 on 8 or 16 devices",
            rows=(1e3, 1e5),
            tables=(120, 200),
            devices=(8, 16),
        ),
        Family(
            name="batch",
            about="global batch 1024 or 8192 (training: 2048)",
            batch=(1024, 8192),
            tables=(20, 60),
        ),
        Family(
            name="bursty",
            about="bursty bag lengths (gamma-Poisson, CV 1-3) on Zipf tables",
            bag_cv=(1.0, 3.0),
        ),
        Family(
            name="wide",
            about="dims 256-1024, beyond the training range (4-256)",
            rows=(1e3, 1e5),
            dims=(256, 512, 1024),
            pooling=(1.0, 20.0),
            tables=(12, 30),
        ),
        Family(
            name="tall",
            about="rows 5e5-3e6, beyond the training range (up to 5e5)",
            rows=(5e5, 3e6),
            dims=(8, 16, 32),
            tables=(12, 24),
        ),
        Family(
            name="heavy_pooling",
            about="pooling factors 100-400, beyond the training ranges",
            pooling=(100.0, 400.0),
            rows=(1e4, 4e5),
            tables=(12, 40),
        ),
    )
}
TRAIN_FAMILIES = ("pool", "zipf", "uniform", "tight", "unequal", "large", "batch")
HELDOUT_FAMILIES = ("bursty", "wide", "tall", "heavy_pooling")


def family(name: str) -> Family:
    """The family called ``name`` (a ``ValueError`` naming the known ones otherwise)."""
    if name not in FAMILIES:
        raise ValueError(f"unknown task family {name!r}; known: {sorted(FAMILIES)}")
    return FAMILIES[name]


def zipf_reuse_hist(
    rows: int, accesses: int, exponent: float, rng: np.random.Generator
) -> tuple[float, ...]:
    """The reuse histogram of ``accesses`` Zipf(``exponent``) ids over ``rows`` rows."""
    n = int(min(max(accesses, 1), MAX_SIMULATED_IDS))
    if exponent == 0:
        ids = rng.integers(0, rows, n)
    else:
        weights = np.arange(1, rows + 1, dtype=np.float64) ** -exponent
        ids = rng.choice(rows, size=n, p=weights / weights.sum())
    return hist_from_ids(ids)


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def draw_table(fam: Family, name: str, batch_size: int, rng: np.random.Generator) -> TableSpec:
    """One fresh table of a ``zipf``-access family."""
    rows = int(round(_log_uniform(rng, *fam.rows)))
    dim = int(rng.choice(fam.dims))
    pooling = round(_log_uniform(rng, *fam.pooling), 3)
    exponent = float(rng.uniform(*fam.zipf))
    hist = zipf_reuse_hist(rows, int(round(batch_size * pooling)), exponent, rng)
    cv = None if fam.bag_cv is None else round(float(rng.uniform(*fam.bag_cv)), 3)
    return TableSpec(
        name=name, rows=rows, dim=dim, pooling_factor=pooling, reuse_hist=hist, bag_length_cv=cv
    )


def _seed_stream(fam: Family, split: str, seed: int) -> np.random.Generator:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    tag = sum(ord(c) * 31**i for i, c in enumerate(fam.name)) % 2**31
    return np.random.default_rng([tag, SPLITS.index(split), seed])


def _memory(fam: Family, tables: Sequence[TableSpec], D: int, rng: np.random.Generator):
    factor = float(rng.choice(fam.memory))
    total = sum(t.size_bytes for t in tables)
    biggest = max(t.size_bytes for t in tables)
    if fam.unequal == 0:
        return factor
    shares = rng.uniform(1 - fam.unequal, 1 + fam.unequal, D)
    mem = np.maximum(shares / shares.mean() * factor * total / D, 1.05 * biggest)
    return [int(math.ceil(m)) for m in mem]


def draw_task(
    name: str,
    split: str = "test",
    seed: int = 0,
    num_tables: tuple[int, int] | None = None,
    num_devices: Sequence[int] | None = None,
) -> Task:
    """Task ``seed`` of family ``name``'s ``split``; ``num_tables`` and ``num_devices``
    override the family's ranges."""
    fam = family(name)
    rng = _seed_stream(fam, split, seed)
    lo, hi = num_tables or fam.tables
    T = int(rng.integers(lo, hi + 1))
    D = int(rng.choice(list(num_devices or fam.devices)))
    B = int(rng.choice(fam.batch))
    if fam.access == "pool":
        sampler = TaskSampler(synthetic_pool(scale=CPU_POOL_SCALE, seed=0), seed=0)
        return sampler.sample(split, T, D, B, float(rng.choice(fam.memory)), rng=rng)
    tables = [draw_table(fam, f"{fam.name}{seed}_t{i}", B, rng) for i in range(T)]
    memory = _memory(fam, tables, D, rng)
    if isinstance(memory, list):
        return Task(tables=tables, num_devices=D, memory_bytes=memory, batch_size=B)
    return make_task(tables, D, B, memory)


def draw_tasks(names: Sequence[str], per_family: int, split: str, seed: int = 0) -> list:
    """``[(family, task)]``: ``per_family`` tasks of each family in ``names``."""
    return [
        (name, draw_task(name, split, seed * 1000 + k)) for name in names for k in range(per_family)
    ]
