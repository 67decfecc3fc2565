"""Tasks (tables + devices + memory + batch) and placements (a device per table)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from torchrec_dreamshard.data.tables import TableSpec, short_repr
from torchrec_dreamshard.data.task_fields import (
    CLUSTER_KEYS,
    COMPUTE_DEVICES,
    GLOBAL_BATCH_KEY,
    MAX_BATCH_SIZE,
    MAX_DEVICES,
    MAX_MEMORY_BYTES,
    MAX_TABLES,
    OLD_BATCH_KEY,
    bounded_int,
    cluster_devices,
    warn_old_batch_key,
)
from torchrec_dreamshard.io import atomic_write, dumps_strict, read_json

Placement = list[int]
"""A device index per table, in the task's table order."""


class NoPlanError(ValueError):
    """A placer found no placement that fits."""


class InsufficientMemoryError(NoPlanError):
    """The tables do not fit the devices' memory (the message names the tables and bytes).

    The one error of placing the planner's partitioner turns into TorchRec's
    ``PlannerError`` of insufficient storage; any other raises as itself."""


@dataclass(kw_only=True)
class Task:
    """A placement problem.

    Attributes:
        memory_bytes: capacity per device in bytes: one number for all, or one per device
            (``memory``: the per-device list).
        batch_size: the global batch over all devices (a task file's ``global_batch_size``;
            TorchRec's per-rank one is
            :func:`~torchrec_dreamshard.data.task_fields.per_rank_batch`).
        compute_device: ``"cpu"`` (``memory_bytes`` is each rank's DDR) or ``"cuda"``
            (each GPU's HBM).
        local_world_size: devices per host (``None``: all on one host).
        allow_oversized: accept tables bigger than every device (for column-wise splits);
            the total must still fit.
    """

    tables: list[TableSpec]
    num_devices: int
    memory_bytes: int | list[int]
    batch_size: int
    compute_device: str = "cpu"
    local_world_size: int | None = None
    allow_oversized: bool = field(default=False, repr=False, compare=False)
    memory: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.tables = list(self.tables)
        self.num_devices = bounded_int("num_devices", self.num_devices, MAX_DEVICES)
        self._check_cluster()
        self.batch_size = bounded_int("batch_size", self.batch_size, MAX_BATCH_SIZE)
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
        if too_big and not self.allow_oversized:
            raise InsufficientMemoryError(
                f"tables {too_big} are bigger than every device ({biggest} bytes at most)"
            )
        total = sum(t.size_bytes for t in self.tables)
        if total > sum(self.memory):
            raise InsufficientMemoryError(
                f"the tables need {total} bytes but the {self.num_devices} devices hold "
                f"{sum(self.memory)} bytes in total"
            )

    def _check_cluster(self) -> None:
        if self.compute_device not in COMPUTE_DEVICES:
            raise ValueError(
                f"compute_device must be one of {list(COMPUTE_DEVICES)}, got "
                f"{short_repr(self.compute_device)}"
            )
        if self.local_world_size is None:
            return
        local = bounded_int("local_world_size", self.local_world_size, MAX_DEVICES)
        if self.num_devices % local:
            raise ValueError(
                f"num_devices {self.num_devices} is not a whole number of hosts of "
                f"local_world_size {local} devices"
            )
        self.local_world_size = local

    @property
    def hosts(self) -> int:
        """Hosts of ``local_world_size`` devices (1 where it is not given)."""
        return self.num_devices // (self.local_world_size or self.num_devices)

    def _per_device_memory(self) -> list[int]:
        mem = self.memory_bytes
        values = list(mem) if isinstance(mem, list | tuple) else [mem] * self.num_devices
        if len(values) != self.num_devices:
            raise ValueError(
                f"memory_bytes lists {len(values)} devices but num_devices is {self.num_devices}"
            )
        return [
            bounded_int(f"memory_bytes of device {i}", v, MAX_MEMORY_BYTES, whole_floats=True)
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
        """The task as a task file's JSON object (the batch as ``global_batch_size``)."""
        mem = self.memory_bytes
        return {
            "num_devices": self.num_devices,
            "memory_bytes": list(mem) if isinstance(mem, list | tuple) else mem,
            GLOBAL_BATCH_KEY: self.batch_size,
            **self._cluster_dict(),
            "tables": [t.to_dict() for t in self.tables],
        }

    def _cluster_dict(self) -> dict[str, Any]:
        """The cluster's fields where they are not the defaults (one host of CPU ranks)."""
        out: dict[str, Any] = {}
        if self.compute_device != "cpu":
            out["compute_device"] = self.compute_device
        if self.local_world_size is not None:
            out["hosts"] = self.hosts
            out["local_world_size"] = self.local_world_size
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], allow_oversized: bool = False) -> Task:
        """A task from a task file's JSON object (the older ``batch_size`` key read without
        a warning); a ``ValueError`` names the field that is missing, unknown or wrong."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a task must be a JSON object, got {type(data).__name__}")
        fields = {"num_devices", "memory_bytes", "tables"}
        given = set(data)
        num_devices = cluster_devices(data)
        if num_devices is not None:  # given, or hosts x local_world_size
            given.add("num_devices")
        if GLOBAL_BATCH_KEY in given and OLD_BATCH_KEY in given:
            raise ValueError(
                f"task gives both {GLOBAL_BATCH_KEY!r} and {OLD_BATCH_KEY!r} (its older "
                f"name): keep {GLOBAL_BATCH_KEY!r} only"
            )
        batch_key = OLD_BATCH_KEY if OLD_BATCH_KEY in given else GLOBAL_BATCH_KEY
        missing = (fields | {batch_key}) - given
        if missing:
            raise ValueError(f"task is missing fields {sorted(missing)}")
        unknown = given - fields - {batch_key} - CLUSTER_KEYS
        if unknown:
            raise ValueError(f"task has unknown fields {sorted(unknown)}")
        if not isinstance(data["tables"], list):
            raise ValueError("task field 'tables' must be a list of table objects")
        return cls(
            tables=[TableSpec.from_dict(t) for t in data["tables"]],
            num_devices=num_devices,
            memory_bytes=data["memory_bytes"],
            batch_size=bounded_int(batch_key, data[batch_key], MAX_BATCH_SIZE),
            compute_device=data.get("compute_device", "cpu"),
            local_world_size=data.get("local_world_size"),
            allow_oversized=allow_oversized,
        )

    def save(self, path: str | Path) -> None:
        """Write the task as JSON, atomically."""
        atomic_write(path, dumps_strict(self.to_dict()), "task file")

    @classmethod
    def load(cls, path: str | Path, allow_oversized: bool = False) -> Task:
        """Read a task file strictly (:func:`torchrec_dreamshard.io.read_json`); a
        ``ValueError`` names the file and the field that is wrong."""
        data = read_json(path, "task file")
        warn_old_batch_key(data, path)
        try:
            return cls.from_dict(data, allow_oversized=allow_oversized)
        except ValueError as exc:
            raise ValueError(f"task file {str(path)!r}: {exc}") from None


# -- placements ---------------------------------------------------------------------------


def check_placement(task: Task, placement: Sequence[int]) -> Placement:
    """The placement as a list of ints; a ``ValueError`` for a wrong length, a device out
    of range or over its memory (naming it and its tables)."""
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
    """The weight bytes ``placement`` puts on each of ``task``'s devices."""
    return placed_bytes([t.size_bytes for t in task.tables], placement, task.num_devices)


def placed_bytes(sizes: Sequence[int], placement: Sequence[int], num_devices: int) -> list[int]:
    """The bytes on each of ``num_devices`` devices where table ``i``, of ``sizes[i]`` bytes,
    is on device ``placement[i]``."""
    used = [0] * num_devices
    for nbytes, d in zip(sizes, placement, strict=True):
        used[d] += nbytes
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


def random_placement(task: Task, seed: int | Sequence[int] | np.random.Generator = 0) -> list[int]:
    """A uniformly random device with room left for each table, largest first (so a
    placement is found whenever greedy finds one); ``InsufficientMemoryError`` otherwise."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    free = list(task.memory)
    placement = [0] * len(task.tables)
    order = sorted(range(len(task.tables)), key=lambda i: -task.tables[i].size_bytes)
    for i in order:
        size = task.tables[i].size_bytes
        legal = [d for d in range(task.num_devices) if free[d] >= size]
        if not legal:
            raise InsufficientMemoryError(
                f"table {task.tables[i].name!r} ({size} bytes) fits on no device: the devices "
                f"have {free} bytes left"
            )
        d = int(rng.choice(legal))
        placement[i] = d
        free[d] -= size
    return placement
