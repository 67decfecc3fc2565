"""Column-wise splits: a table's columns cut into shards placed like tables. The shard of
``t`` holding columns ``[a, b)`` is a :class:`TableSpec` named ``t@a:b`` (``t``'s rows,
pooling and reuse, dim ``b - a``); widths follow TorchRec's column-wise rule."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task, check_placement

SHARD_COLUMN_MULTIPLE = 4  # columns: TorchRec's column-wise shard widths are multiples of 4
MAX_SHARDS = 16  # shards of one table at most (and never more than devices)


def shard_name(table: str, start: int, end: int) -> str:
    """The name of the shard of ``table`` holding columns ``[start, end)``."""
    return f"{table}@{start}:{end}"


def split_counts(spec: TableSpec, max_shards: int = MAX_SHARDS, min_width: int = 0) -> list[int]:
    """The shard counts ``2 <= n <= max_shards`` TorchRec's column-wise rule allows for ``spec``."""
    out = []
    for n in range(2, min(max_shards, spec.dim) + 1):
        width, rest = divmod(spec.dim, n)
        if rest == 0 and width % SHARD_COLUMN_MULTIPLE == 0 and width >= min_width:
            out.append(n)
    return out


def column_shards(spec: TableSpec, n: int) -> list[TableSpec]:
    """``spec`` in ``n`` equal column-wise shards (``[spec]`` for ``n = 1``); a
    ``ValueError`` naming the allowed counts for another ``n``."""
    if n == 1:
        return [spec]
    allowed = split_counts(spec, max_shards=spec.dim)
    if n not in allowed:
        raise ValueError(
            f"table {spec.name!r} (dim {spec.dim}) cannot be cut into {n} column-wise shards: "
            f"shards are equal, a multiple of {SHARD_COLUMN_MULTIPLE} columns wide; allowed "
            f"counts are {allowed or 'none'}"
        )
    width = spec.dim // n
    return [shard_spec(spec, k * width, (k + 1) * width) for k in range(n)]


def shard_spec(spec: TableSpec, start: int, end: int) -> TableSpec:
    """The shard of ``spec`` holding columns ``[start, end)``, named ``name@start:end``."""
    return dataclasses.replace(spec, name=shard_name(spec.name, start, end), dim=end - start)


@dataclass(frozen=True)
class ShardTask:
    """A task with some tables cut into column-wise shards.

    Attributes:
        task: the original task.
        columns: column ranges ``[(start, end), ...]`` of every split table, by name.
        shards: every whole table and shard in the original order, same devices and batch.
        owner: for each table of ``shards``, the index of its table in ``task``.
    """

    task: Task
    columns: dict[str, list[tuple[int, int]]]
    shards: Task
    owner: list[int]

    @property
    def counts(self) -> dict[str, int]:
        """Shard count of every split table."""
        return {name: len(cols) for name, cols in self.columns.items()}


def shard_task(task: Task, columns: Mapping[str, int | Sequence[tuple[int, int]]]) -> ShardTask:
    """``task`` with the tables in ``columns`` split, by shard count or explicit ranges
    (``{"t0": 2, "t1": [(0, 64), (64, 128)]}``).

    Raises:
        ValueError: an unknown table, a disallowed count, or ranges that do not cover the
            dim once.
    """
    by_name = {t.name: t for t in task.tables}
    unknown = sorted(set(columns) - set(by_name))
    if unknown:
        raise ValueError(f"split tables {unknown} are not in the task")
    ranges: dict[str, list[tuple[int, int]]] = {}
    for name, value in columns.items():
        spec = by_name[name]
        if isinstance(value, int | np.integer):
            cols = _ranges(column_shards(spec, int(value)))
        else:
            cols = [(int(a), int(b)) for a, b in value]
            check_cover(spec, cols)
        if len(cols) > 1:
            ranges[name] = cols
    tables: list[TableSpec] = []
    owner: list[int] = []
    for i, spec in enumerate(task.tables):
        cols = ranges.get(spec.name)
        parts = [spec] if cols is None else [shard_spec(spec, a, b) for a, b in cols]
        tables += parts
        owner += [i] * len(parts)
    shards = Task(
        tables=tables,
        num_devices=task.num_devices,
        memory_bytes=task.memory_bytes,
        batch_size=task.batch_size,
        allow_oversized=True,
    )
    return ShardTask(task=task, columns=ranges, shards=shards, owner=owner)


def _ranges(shards: Sequence[TableSpec]) -> list[tuple[int, int]]:
    out, start = [], 0
    for s in shards:
        out.append((start, start + s.dim))
        start += s.dim
    return out


def check_cover(spec: TableSpec, cols: Sequence[tuple[int, int]]) -> None:
    """Raise ``ValueError`` unless ``cols`` cover ``[0, spec.dim)`` exactly once, in order."""
    at = 0
    for a, b in cols:
        if a != at or b <= a:
            raise ValueError(
                f"table {spec.name!r}: shard columns {list(cols)} must cover 0..{spec.dim} "
                f"exactly once, in order (expected a shard starting at {at}, got [{a}, {b}))"
            )
        at = b
    if at != spec.dim:
        raise ValueError(
            f"table {spec.name!r}: shard columns {list(cols)} end at {at}, the table's dim "
            f"is {spec.dim}"
        )


def plan_entries(
    sharded: ShardTask, placement: Sequence[int]
) -> tuple[dict[str, int], dict[str, list[dict[str, Any]]]]:
    """The plan file's ``placement`` (whole tables) and ``shards`` (split tables) of a
    placement of ``sharded.shards`` (memory unchecked)."""
    placement = [int(d) for d in placement]
    if len(placement) != len(sharded.shards.tables):
        raise ValueError(
            f"placement has {len(placement)} entries for {len(sharded.shards.tables)} tables"
        )
    whole: dict[str, int] = {}
    split: dict[str, list[dict[str, Any]]] = {}
    k = 0
    for spec in sharded.task.tables:
        cols = sharded.columns.get(spec.name)
        if cols is None:
            whole[spec.name] = placement[k]
            k += 1
            continue
        split[spec.name] = [
            {"device": placement[k + j], "columns": [a, b]} for j, (a, b) in enumerate(cols)
        ]
        k += len(cols)
    return whole, split


def plan_from_entries(
    task: Task, placement: Mapping[str, Any], shards: Mapping[str, Any] | None = None
) -> tuple[ShardTask, list[int]]:
    """The shard task and placement of a plan file's ``placement`` and ``shards``.

    Raises:
        ValueError: a table in neither or both, an unknown table, malformed shard entries,
            columns not covering the table once, or a device over its memory.
    """
    shards = dict(shards or {})
    names = set(task.names)
    both = sorted(set(placement) & set(shards))
    missing = sorted(names - set(placement) - set(shards))
    unknown = sorted((set(placement) | set(shards)) - names)
    if both or missing or unknown:
        raise ValueError(
            "plan does not match the task: tables in both placement and shards "
            f"{both}, missing tables {missing}, unknown {unknown}"
        )
    columns: dict[str, list[tuple[int, int]]] = {}
    devices: dict[str, list[Any]] = {}
    for name, entries in shards.items():
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"shards of table {name!r} must be a non-empty list")
        cols, devs = [], []
        for e in entries:
            ok = isinstance(e, Mapping) and set(e) == {"device", "columns"}
            ok = ok and isinstance(e["columns"], list) and len(e["columns"]) == 2
            if not ok or not all(
                isinstance(c, int) and not isinstance(c, bool) for c in e["columns"]
            ):
                raise ValueError(
                    f'shards of table {name!r}: each must be {{"device": d, "columns": '
                    f"[start, end]}}, got {e!r}"
                )
            cols.append((e["columns"][0], e["columns"][1]))
            devs.append(e["device"])
        columns[name] = cols
        devices[name] = devs
    sharded = shard_task(task, columns)
    flat: list[Any] = []
    for spec in task.tables:
        flat += devices[spec.name] if spec.name in columns else [placement[spec.name]]
    return sharded, check_placement(sharded.shards, flat)
