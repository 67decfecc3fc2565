"""Tasks (tables + devices + memory + batch), placements, the synthetic DLRM-shaped table
pool, the DreamShard-style task sampler and a loader for Meta's open DLRM dataset files."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchrec_dreamshard.io import atomic_write, dumps_strict, read_json
from torchrec_dreamshard.tables import (
    BIN_MID,
    NUM_REUSE_BINS,
    TableSpec,
    _short,
    access_stats,
)

Placement = list[int]
"""A device index per table, in the task's table order."""

# Share of index accesses by reuse factor published with Meta's open DLRM embedding dataset
# (bins (0,1], (1,2], (2,4], ..., (8192,16384], beyond).
DLRM_PUBLISHED_ACCESS_SHARE: tuple[float, ...] = (
    0.069, 0.044, 0.068, 0.101, 0.121, 0.104, 0.073, 0.058, 0.052,
    0.050, 0.049, 0.048, 0.048, 0.042, 0.031, 0.042,
)  # fmt: skip
DLRM_PUBLISHED_ROWS_ACCESSED_ONCE = 0.47
DLRM_NUM_TABLES = 856
DLRM_BATCH_SIZE = 65536
# Row scale at which the synthetic pool's tables run comfortably on a 2-core CPU.
CPU_POOL_SCALE = 0.1
DEFAULT_MEMORY_FACTOR = 1.5

# Upper bounds of a task's fields (see the README's "Limits and errors").
MAX_DEVICES = 4096  # devices D
MAX_BATCH_SIZE = 2**24  # global batch (samples)
MAX_MEMORY_BYTES = 2**50  # per device (1 PiB)
MAX_TABLES = 100_000  # tables in one task


@dataclass(kw_only=True)
class Task:
    """A placement problem.

    Args:
        tables: the tables to place (names unique).
        num_devices: number of devices D.
        memory_bytes: capacity per device in bytes: one number for all, or one per device.
        batch_size: the global batch each device's fused kernel processes.
    """

    tables: list[TableSpec]
    num_devices: int
    memory_bytes: int | list[int]
    batch_size: int
    memory: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.tables = list(self.tables)
        self.num_devices = _bounded_int("num_devices", self.num_devices, MAX_DEVICES)
        self.batch_size = _bounded_int("batch_size", self.batch_size, MAX_BATCH_SIZE)
        self.memory = self._per_device_memory()
        if not self.tables:
            raise ValueError("a task needs at least one table")
        if len(self.tables) > MAX_TABLES:
            raise ValueError(f"a task holds at most {MAX_TABLES} tables, got {len(self.tables)}")
        for t in self.tables:
            if not isinstance(t, TableSpec):
                raise ValueError(f"tables must be TableSpec, got {type(t).__name__}")
        seen: set[str] = set()
        dupes = sorted({t.name for t in self.tables if t.name in seen or seen.add(t.name)})
        if dupes:
            raise ValueError(f"duplicate table names: {dupes}")
        biggest = max(self.memory)
        too_big = [t.name for t in self.tables if t.size_bytes > biggest]
        if too_big:
            raise ValueError(
                f"tables {too_big} are bigger than every device ({biggest} bytes at most)"
            )
        total = sum(t.size_bytes for t in self.tables)
        if total > sum(self.memory):
            raise ValueError(
                f"the tables need {total} bytes but the {self.num_devices} devices hold "
                f"{sum(self.memory)} bytes in total"
            )

    def _per_device_memory(self) -> list[int]:
        mem = self.memory_bytes
        values = list(mem) if isinstance(mem, list | tuple) else [mem] * self.num_devices
        if len(values) != self.num_devices:
            raise ValueError(
                f"memory_bytes lists {len(values)} devices but num_devices is {self.num_devices}"
            )
        return [
            _bounded_int(f"memory_bytes of device {i}", v, MAX_MEMORY_BYTES, whole_floats=True)
            for i, v in enumerate(values)
        ]

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tables]

    @property
    def total_bytes(self) -> int:
        return sum(t.size_bytes for t in self.tables)

    # -- JSON ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        mem = self.memory_bytes
        return {
            "num_devices": self.num_devices,
            "memory_bytes": list(mem) if isinstance(mem, list | tuple) else mem,
            "batch_size": self.batch_size,
            "tables": [t.to_dict() for t in self.tables],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Task:
        if not isinstance(data, Mapping):
            raise ValueError(f"a task must be a JSON object, got {type(data).__name__}")
        required = {"num_devices", "memory_bytes", "batch_size", "tables"}
        missing = required - set(data)
        if missing:
            raise ValueError(f"task is missing fields {sorted(missing)}")
        unknown = set(data) - required
        if unknown:
            raise ValueError(f"task has unknown fields {sorted(unknown)}")
        if not isinstance(data["tables"], list):
            raise ValueError("task field 'tables' must be a list of table objects")
        return cls(
            tables=[TableSpec.from_dict(t) for t in data["tables"]],
            num_devices=data["num_devices"],
            memory_bytes=data["memory_bytes"],
            batch_size=data["batch_size"],
        )

    def save(self, path: str | Path) -> None:
        """Write the task as JSON, atomically."""
        atomic_write(path, dumps_strict(self.to_dict()), "task file")

    @classmethod
    def load(cls, path: str | Path) -> Task:
        """Read a task file strictly (see :func:`torchrec_dreamshard.io.read_json`).

        Raises:
            ValueError: naming the file and the field that is wrong.
        """
        data = read_json(path, "task file")
        try:
            return cls.from_dict(data)
        except ValueError as exc:
            raise ValueError(f"task file {str(path)!r}: {exc}") from None


def _bounded_int(what: str, value: Any, high: int, whole_floats: bool = False) -> int:
    """``value`` as an int in ``1..high``; floats only when whole (``1.6e10``) and allowed.

    Raises:
        ValueError: naming ``what``, for booleans, non-numbers, fractions and values out
            of range.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(f"{what} must be an integer, got {_short(value)}")
    if isinstance(value, float | np.floating):
        if not (whole_floats and math.isfinite(value) and float(value).is_integer()):
            raise ValueError(f"{what} must be a whole number, got {_short(value)}")
        value = int(value)
    if value < 1:
        raise ValueError(f"{what} must be positive (1..{high}), got {_short(value)}")
    if value > high:
        raise ValueError(f"{what} must be at most {high}, got {_short(value)}")
    return int(value)


# ----------------------------------------------------------------------------------------
# Placements
# ----------------------------------------------------------------------------------------


def check_placement(task: Task, placement: Sequence[int]) -> Placement:
    """Validate a placement; returns it as a list of ints.

    Raises:
        ValueError: wrong length, a device out of range, or a device whose tables exceed its
            memory (naming the device and its tables).
    """
    placement = list(placement)
    if len(placement) != len(task.tables):
        raise ValueError(f"placement has {len(placement)} entries for {len(task.tables)} tables")
    for t, d in zip(task.tables, placement, strict=True):
        if isinstance(d, bool) or not isinstance(d, int | np.integer):
            raise ValueError(f"table {t.name!r}: device must be an integer, got {d!r}")
        if not 0 <= d < task.num_devices:
            raise ValueError(f"table {t.name!r}: device {d} out of range 0..{task.num_devices - 1}")
    placement = [int(d) for d in placement]
    used = device_bytes(task, placement)
    for d, (used_d, cap) in enumerate(zip(used, task.memory, strict=True)):
        if used_d > cap:
            names = [t.name for t, p in zip(task.tables, placement, strict=True) if p == d]
            raise ValueError(
                f"device {d} is over its memory: its tables {names} need {used_d} bytes, "
                f"it holds {cap}"
            )
    return placement


def device_bytes(task: Task, placement: Sequence[int]) -> list[int]:
    used = [0] * task.num_devices
    for t, d in zip(task.tables, placement, strict=True):
        used[d] += t.size_bytes
    return used


def device_tables(task: Task, placement: Sequence[int]) -> list[list[int]]:
    """Table indices on each device."""
    out: list[list[int]] = [[] for _ in range(task.num_devices)]
    for i, d in enumerate(placement):
        out[d].append(i)
    return out


def placement_to_dict(task: Task, placement: Sequence[int]) -> dict[str, int]:
    return {t.name: int(d) for t, d in zip(task.tables, placement, strict=True)}


def placement_from_dict(task: Task, mapping: Mapping[str, Any]) -> Placement:
    """A placement from ``{"table name": device}``; every table must be named once."""
    missing = [n for n in task.names if n not in mapping]
    unknown = [n for n in mapping if n not in set(task.names)]
    if missing or unknown:
        raise ValueError(
            f"placement does not match the task: missing tables {missing}, unknown {unknown}"
        )
    return check_placement(task, [mapping[n] for n in task.names])


# ----------------------------------------------------------------------------------------
# The synthetic DLRM-shaped pool
# ----------------------------------------------------------------------------------------


def access_share_to_row_hist(access_share: Sequence[float]) -> np.ndarray:
    """Convert a share of accesses by reuse bin into the 17-bin fraction of accessed rows.

    Rows in bin ``k`` carry on average ``c_k`` accesses (the middle of the bin's range), so
    the row fraction is ``share_k / c_k``, renormalised. The published DLRM share has 16
    bins (the last is "beyond 8192"); it is spread as bins 15 and 16 equally.
    """
    share = np.asarray(access_share, dtype=np.float64)
    if share.size == NUM_REUSE_BINS - 1:
        share = np.concatenate([share[:-1], [share[-1] / 2, share[-1] / 2]])
    if share.size != NUM_REUSE_BINS:
        raise ValueError(f"access share must have {NUM_REUSE_BINS} or 16 bins")
    rows = share / BIN_MID
    return rows / rows.sum()


def row_hist_to_access_share(hist: Sequence[float]) -> np.ndarray:
    """Inverse of :func:`access_share_to_row_hist` (17 bins)."""
    acc = np.asarray(hist, dtype=np.float64) * BIN_MID
    return acc / acc.sum()


# A table's histogram must be achievable: the rows it touches per batch (at the dataset's
# batch size, unscaled rows) stay within this share of its rows.
_MAX_TOUCHED_SHARE = 0.8
_CALIBRATION_ROUNDS = 12


def _rows_touched(shares: np.ndarray, accesses: np.ndarray) -> np.ndarray:
    """Distinct rows a batch touches, per table: ``accesses * sum_k share_k / mid_k``."""
    return accesses * np.sum(shares / BIN_MID, axis=-1)


def _make_feasible(shares: np.ndarray, accesses: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Shift each table's share of accesses (rows of ``shares``) towards hotter bins, with
    weights ``exp(a * k)`` and the smallest ``a`` found by bisection, until its batch
    touches at most 80% of the table's rows. Feasible tables keep ``a = 0``."""
    limit = _MAX_TOUCHED_SHARE * rows
    k = np.arange(NUM_REUSE_BINS)

    def shifted(a: np.ndarray) -> np.ndarray:
        out = shares * np.exp(a[:, None] * k)
        return out / out.sum(axis=1, keepdims=True)

    lo, hi = np.zeros(len(shares)), np.full(len(shares), 8.0)
    hi[_rows_touched(shares, accesses) <= limit] = 0.0
    for _ in range(40):
        mid = (lo + hi) / 2
        ok = _rows_touched(shifted(mid), accesses) <= limit
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
    return shifted(hi)


def _draw_pool_shapes(num_tables: int, rng: np.random.Generator) -> list[dict]:
    dims = np.array([4, 8, 16, 32, 64, 128, 256])
    dim_p = np.array([0.05, 0.12, 0.2, 0.22, 0.21, 0.12, 0.08])
    return [
        {
            "raw_rows": 10 ** rng.uniform(3.0, math.log10(5e6)),
            "dim": int(rng.choice(dims, p=dim_p)),
            "pooling": round(float(np.clip(np.exp(rng.normal(2.08, 1.1)), 1.0, 100.0)), 3),
            "concentration": float(np.exp(rng.normal(math.log(20.0), 0.5))),
        }
        for _ in range(num_tables)
    ]


def _pool_shares(shapes: list[dict], base: np.ndarray, seed: int) -> np.ndarray:
    """Each table's share of accesses: a Dirichlet draw centred on ``base``, made feasible
    for its rows at the dataset's batch size. Shape ``[tables, 17]``."""
    rng = np.random.default_rng([seed, 1])
    shares = np.stack([rng.dirichlet(base * s["concentration"] + 1e-3) for s in shapes])
    accesses = np.array([s["pooling"] * DLRM_BATCH_SIZE for s in shapes])
    rows = np.array([round(s["raw_rows"]) for s in shapes], dtype=np.float64)
    return _make_feasible(shares, accesses, rows)


def synthetic_pool(
    num_tables: int = DLRM_NUM_TABLES, scale: float = 1.0, seed: int = 0
) -> list[TableSpec]:
    """Tables shaped like Meta's open DLRM embedding dataset.

    * rows: log-uniform between 1e3 and 5e6, times ``scale`` (at least 16);
    * dim: 4 to 256 in powers of two, mid-sized dims most common;
    * pooling factor: log-normal around 8, clipped to [1, 100];
    * reuse: each table's share of accesses by reuse bin is a Dirichlet draw around a
      common base, made achievable (a batch of the dataset's size 65536 touches at most 80%
      of the table's unscaled rows, so small tables are hot), and turned into a fraction of
      accessed rows by :func:`access_share_to_row_hist`. The base is calibrated by a few
      fixed-point rounds so that the pool, weighted by accesses, reproduces the published
      share; ``benchmarks/pool_stats.py`` compares both the specs and generated ids.

    Args:
        num_tables: tables in the pool (856 like the dataset).
        scale: multiplies every table's rows; ``CPU_POOL_SCALE`` for CPU work. The
            histograms do not change with it (at a CPU batch of 2048 and scale 0.1 a batch
            touches even fewer of a table's rows than at the dataset's batch and scale 1).
        seed: the pool is a pure function of its arguments.
    """
    return list(_synthetic_pool(num_tables, float(scale), seed))


@functools.lru_cache(maxsize=8)
def _synthetic_pool(num_tables: int, scale: float, seed: int) -> tuple[TableSpec, ...]:
    if num_tables < 1:
        raise ValueError(f"num_tables must be >= 1, got {num_tables}")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    rng = np.random.default_rng(seed)
    shapes = _draw_pool_shapes(num_tables, rng)
    target = np.asarray(DLRM_PUBLISHED_ACCESS_SHARE)
    target = np.concatenate([target[:-1], [target[-1] / 2, target[-1] / 2]])
    target = target / target.sum()
    weights = np.array([s["pooling"] for s in shapes])
    base = target.copy()
    for _ in range(_CALIBRATION_ROUNDS):
        shares = _pool_shares(shapes, base, seed)
        pooled = weights @ shares
        pooled /= pooled.sum()
        base = base * np.sqrt(np.clip(target / np.maximum(pooled, 1e-9), 0.1, 10.0))
        base /= base.sum()
    shares = _pool_shares(shapes, base, seed)
    return tuple(
        TableSpec(
            name=f"dlrm_{i:03d}",
            rows=max(16, int(round(s["raw_rows"] * scale))),
            dim=s["dim"],
            pooling_factor=s["pooling"],
            reuse_hist=tuple(float(x) for x in access_share_to_row_hist(share)),
        )
        for i, (s, share) in enumerate(zip(shapes, shares, strict=True))
    )


def pool_access_share(tables: Sequence[TableSpec], batch_size: int) -> np.ndarray:
    """The pool's share of accesses by reuse bin (17 bins), weighted by each table's
    accesses per batch."""
    acc = np.zeros(NUM_REUSE_BINS)
    for t in tables:
        acc += row_hist_to_access_share(t.hist(batch_size)) * t.pooling_factor * batch_size
    return acc / acc.sum()


def pool_rows_accessed_once(tables: Sequence[TableSpec], batch_size: int) -> float:
    """Fraction of all accessed rows (over the pool) that are accessed once per batch."""
    once = total = 0.0
    for t in tables:
        hist = t.hist(batch_size)
        rows_accessed = t.pooling_factor * batch_size / float(np.sum(hist * BIN_MID))
        once += hist[0] * rows_accessed
        total += rows_accessed
    return once / total


# ----------------------------------------------------------------------------------------
# Task sampler
# ----------------------------------------------------------------------------------------


def _as_range(value: int | tuple[int, int], what: str) -> tuple[int, int]:
    lo, hi = (value, value) if isinstance(value, int) else tuple(value)
    if not 1 <= lo <= hi:
        raise ValueError(f"{what} must be a positive int or (low, high) with low <= high")
    return int(lo), int(hi)


class TaskSampler:
    """Draws DreamShard-style tasks from a table pool split into train and test halves.

    Memory rule: every device holds ``memory_factor`` times the task's bytes divided by
    the number of devices, and at least 1.05 times the task's largest table.

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
    ) -> Task:
        """One task: T tables drawn without replacement from ``split`` (T uniform in the
        range), D drawn from ``num_devices``."""
        if split not in self.splits:
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if memory_factor < 1:
            raise ValueError(f"memory_factor must be >= 1, got {memory_factor}")
        tables = self.splits[split]
        lo, hi = _as_range(num_tables, "num_tables")
        if hi > len(tables):
            raise ValueError(f"asked for up to {hi} tables but the {split} split has {len(tables)}")
        devices = [num_devices] if isinstance(num_devices, int) else list(num_devices)
        t = int(self.rng.integers(lo, hi + 1))
        d = int(self.rng.choice(devices))
        chosen = [tables[i] for i in sorted(self.rng.choice(len(tables), t, replace=False))]
        return make_task(chosen, d, batch_size, memory_factor)


def make_task(
    tables: Sequence[TableSpec],
    num_devices: int,
    batch_size: int,
    memory_factor: float = DEFAULT_MEMORY_FACTOR,
) -> Task:
    """A task whose per-device memory follows the sampler's rule."""
    total = sum(t.size_bytes for t in tables)
    cap = max(memory_factor * total / num_devices, 1.05 * max(t.size_bytes for t in tables))
    return Task(
        tables=list(tables),
        num_devices=num_devices,
        memory_bytes=int(math.ceil(cap)),
        batch_size=batch_size,
    )


# ----------------------------------------------------------------------------------------
# Meta's open DLRM embedding dataset
# ----------------------------------------------------------------------------------------


@dataclass
class DatasetTable:
    """A table read from a dataset file: its spec and its id stream."""

    spec: TableSpec
    ids: torch.Tensor
    offsets: torch.Tensor


def load_dlrm_dataset(
    path: str | Path,
    dim: int | Sequence[int] = 64,
    tables: Sequence[int] | None = None,
    prefix: str = "dlrm",
) -> list[DatasetTable]:
    """Read a file of Meta's open DLRM embedding dataset (e.g. ``fbgemm_t856_bs65536.pt``).

    The file holds ``(indices, offsets, lengths)``: flat ids, ``T * B + 1`` offsets in
    table-major order, and ``lengths`` shaped ``[T, B]``. It is read with
    ``torch.load(weights_only=True)``, so nothing in it is executed. Rows are the largest id
    + 1; the dataset has no dims, so give one for all or one per table. Tables with no ids
    are skipped (their pooling factor would be 0).

    Args:
        path: the file.
        dim: embedding dim for every table, or one per table of the file.
        tables: indices of the tables to read (default all).
        prefix: table names are ``f"{prefix}_{index:03d}"``.
    """
    try:
        data = torch.load(Path(path), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"dataset file {str(path)!r} does not exist") from None
    except Exception as exc:  # unpickling errors come in many types
        raise ValueError(f"dataset file {str(path)!r} could not be read safely: {exc}") from None
    if not (isinstance(data, list | tuple) and len(data) == 3):
        raise ValueError(f"dataset file {str(path)!r} must hold (indices, offsets, lengths)")
    indices, offsets, lengths = (torch.as_tensor(x) for x in data)
    if lengths.dim() != 2:
        raise ValueError(f"dataset file {str(path)!r}: lengths must be [tables, batch]")
    num_tables, batch = lengths.shape
    if offsets.numel() != num_tables * batch + 1:
        raise ValueError(
            f"dataset file {str(path)!r}: offsets has {offsets.numel()} entries, "
            f"expected tables*batch+1 = {num_tables * batch + 1}"
        )
    dims = [dim] * num_tables if isinstance(dim, int) else list(dim)
    if len(dims) != num_tables:
        raise ValueError(f"got {len(dims)} dims for {num_tables} tables")
    out = []
    for t in range(num_tables) if tables is None else tables:
        if not 0 <= t < num_tables:
            raise ValueError(f"table index {t} out of range 0..{num_tables - 1}")
        lo, hi = int(offsets[t * batch]), int(offsets[(t + 1) * batch])
        if hi == lo:
            continue
        ids = indices[lo:hi].to(torch.int64)
        local = (offsets[t * batch : (t + 1) * batch + 1] - lo).to(torch.int64)
        pooling, hist = access_stats(ids, local)
        spec = TableSpec(
            name=f"{prefix}_{t:03d}",
            rows=int(ids.max()) + 1,
            dim=int(dims[t]),
            pooling_factor=pooling,
            reuse_hist=hist,
        )
        out.append(DatasetTable(spec=spec, ids=ids, offsets=local))
    return out
