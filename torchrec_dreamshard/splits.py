"""Column-wise splits: a table's columns cut into shards that are placed like tables.

A shard of table ``t`` holding columns ``[a, b)`` is the :class:`TableSpec` with ``t``'s
rows, dim ``b - a``, the same pooling factor and reuse histogram, named ``t@a:b``: it
looks up the same ids and its pooled output is its share of the table's. The cost
network, the policy and the measurement backends therefore take a task of shards as they
take any task (:class:`ShardTask`), and the all-to-all counts each shard's output.

Shard widths follow TorchRec's column-wise rule (``torchrec/distributed/sharding_plan.py``):
a table of dim ``D`` is cut into ``n`` shards of equal width ``D / n``, a multiple of
:data:`SHARD_COLUMN_MULTIPLE` columns and at least the table's minimum width (TorchRec's
``ParameterConstraints.min_partition``).

When the planner splits (:func:`plan_with_splits`):

1. a table bigger than every device is split into the fewest shards that fit one;
2. if the policy still finds no placement (memory too tight to pack whole tables), the
   table with the largest shards is split further, until it does;
3. then, a few rounds: the cost network names the bottleneck device, the costliest tables
   on it are each tried split in twice as many shards (the new shards go to the least
   loaded devices with room), and a split is kept when the predicted step falls by at
   least :data:`MIN_GAIN`; finally the policy re-places the task of shards and the better
   of the two predictions is kept. The search starts from the whole-table plan, so the
   predicted step never gets worse than the table-wise one.

The work is bounded (:data:`SEARCH_ROUNDS` x :data:`SEARCH_TABLES` cost-network
predictions, one or two policy runs), so planning 1000 tables on 64 devices stays within
the time of the policy runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchrec_dreamshard.tables import TableSpec
from torchrec_dreamshard.tasks import Task, check_placement, device_bytes

SHARD_COLUMN_MULTIPLE = 4  # columns: TorchRec's column-wise shard widths are multiples of 4
MAX_SHARDS = 16  # shards of one table at most (and never more than devices)
SEARCH_ROUNDS = 8  # rounds of the split search
SEARCH_TABLES = 2  # tables tried per round: the costliest on the bottleneck device
MIN_GAIN = 0.01  # relative fall of the predicted step for a split to be kept
FIT_ATTEMPTS = 12  # further splits tried while the policy finds no placement
REPLACE_MAX_TABLES = 400  # the policy re-places the shard task when it has at most this many


def shard_name(table: str, start: int, end: int) -> str:
    """The name of the shard of ``table`` holding columns ``[start, end)``."""
    return f"{table}@{start}:{end}"


def split_counts(spec: TableSpec, max_shards: int = MAX_SHARDS, min_width: int = 0) -> list[int]:
    """The shard counts ``n >= 2`` TorchRec's column-wise rule allows for ``spec``: ``n``
    divides the dim, the width ``dim / n`` is a multiple of :data:`SHARD_COLUMN_MULTIPLE`
    and at least ``min_width``, and ``n <= max_shards``."""
    out = []
    for n in range(2, min(max_shards, spec.dim) + 1):
        width, rest = divmod(spec.dim, n)
        if rest == 0 and width % SHARD_COLUMN_MULTIPLE == 0 and width >= min_width:
            out.append(n)
    return out


def column_shards(spec: TableSpec, n: int) -> list[TableSpec]:
    """``spec`` cut into ``n`` column-wise shards of equal width (``[spec]`` for ``n = 1``).

    Raises:
        ValueError: ``n`` is not a count TorchRec's column-wise rule allows for the table
            (see :func:`split_counts`), naming the counts it allows.
    """
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
    """The shard of ``spec`` holding columns ``[start, end)``: its rows, ``end - start``
    columns, its pooling and reuse, named ``name@start:end``."""
    return dataclasses.replace(spec, name=shard_name(spec.name, start, end), dim=end - start)


@dataclass(frozen=True)
class ShardTask:
    """A task with some tables cut into column-wise shards.

    Attributes:
        task: the original task.
        columns: the column ranges ``[(start, end), ...]`` of every split table, by name
            (tables not in it are whole).
        shards: the task the policy and the measurement see: every whole table and every
            shard, in the original table order (a table's shards consecutively), with the
            original devices, memory and batch.
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
    """``task`` with the tables named in ``columns`` split: each name maps to a shard count
    (equal widths, :func:`column_shards`) or to explicit column ranges that cover the
    table's columns exactly once, in order.

    Raises:
        ValueError: an unknown table, a count the column-wise rule does not allow, or
            ranges that leave a gap, overlap or go past the table's dim.
    """
    by_name = {t.name: t for t in task.tables}
    unknown = sorted(set(columns) - set(by_name))
    if unknown:
        raise ValueError(f"split tables {unknown} are not in the task")
    ranges: dict[str, list[tuple[int, int]]] = {}
    for name, value in columns.items():
        spec = by_name[name]
        if isinstance(value, int | np.integer):
            shards = column_shards(spec, int(value))
            cols = [(0, spec.dim)] if len(shards) == 1 else _ranges(shards)
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


# ----------------------------------------------------------------------------------------
# Plans with shards: {"placement": {whole table: device}, "shards": {table: [...]}}
# ----------------------------------------------------------------------------------------


def plan_entries(
    sharded: ShardTask, placement: Sequence[int]
) -> tuple[dict[str, int], dict[str, list[dict[str, Any]]]]:
    """The plan file's ``placement`` (whole tables) and ``shards`` (split tables:
    ``[{"device": d, "columns": [start, end]}, ...]``) of a placement of ``sharded.shards``
    (memory is not checked here: :func:`check_placement` does that)."""
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
    """The shard task and its placement of a plan file's ``placement`` and ``shards``.

    Raises:
        ValueError: a table named in neither or in both, an unknown table, shard entries
            that are not ``{"device": int, "columns": [start, end]}``, columns that do not
            cover the table exactly once, or a device over its memory.
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


# ----------------------------------------------------------------------------------------
# The split search
# ----------------------------------------------------------------------------------------


@dataclass
class SplitPlan:
    """What :func:`plan_with_splits` found.

    Attributes:
        sharded: the task of shards.
        placement: a device per table of ``sharded.shards``.
        predicted_ms: the cost network's step cost of it.
        whole_ms: the predicted step cost of the whole-table placement the search started
            from (``None`` when no placement of whole tables fits).
    """

    sharded: ShardTask
    placement: list[int]
    predicted_ms: float
    whole_ms: float | None


def plan_with_splits(
    agent: Any,
    task: Task,
    mode: str | None = None,
    num_samples: int = 16,
    seed: int = 0,
    splittable: Mapping[str, int] | None = None,
    max_shards: int = MAX_SHARDS,
) -> SplitPlan:
    """Place ``task``, splitting tables column-wise where that fits or pays (see the module
    docstring).

    Args:
        agent: a DreamShard agent (``place``, ``predict``, ``table_costs``).
        task: the task; may hold tables bigger than every device (``allow_oversized``).
        mode: the agent's placement mode (``None``: the agent's default).
        num_samples: passed to ``agent.place``.
        seed: passed to ``agent.place``.
        splittable: the tables that may be split, each with its minimum shard width
            (``None``: every table, minimum :data:`SHARD_COLUMN_MULTIPLE`).
        max_shards: shards of one table at most (capped at the number of devices).

    Raises:
        ValueError: a table bigger than every device that may not be split or cannot be
            split small enough, or no placement even after splitting (the agent's error).
    """
    limit = max(1, min(max_shards, task.num_devices))
    allowed = _splittable(task, splittable)

    def next_count(name: str, at_least: int) -> int | None:
        """The smallest allowed shard count of table ``name`` that is ``>= at_least``."""
        if name not in allowed:
            return None
        counts = [n for n in split_counts(specs[name], limit, allowed[name]) if n >= at_least]
        return counts[0] if counts else None

    specs = {t.name: t for t in task.tables}
    counts = _forced_counts(task, allowed, limit)
    sharded, placement = _place_fitting(agent, task, counts, next_count, mode, num_samples, seed)
    prediction = agent.predict(sharded.shards, placement)
    whole_ms = None if sharded.columns else float(prediction.step_ms)
    best = SplitPlan(sharded, placement, float(prediction.step_ms), whole_ms)
    best = _improve(agent, best, next_count)
    if best.sharded.columns and len(best.sharded.shards.tables) <= REPLACE_MAX_TABLES:
        again = _place(agent, best.sharded.shards, mode, num_samples, seed)
        again_ms = float(agent.predict(best.sharded.shards, again).step_ms)
        if again_ms < best.predicted_ms:
            best = SplitPlan(best.sharded, again, again_ms, best.whole_ms)
    return best


def _splittable(task: Task, splittable: Mapping[str, int] | None) -> dict[str, int]:
    if splittable is None:
        return {t.name: SHARD_COLUMN_MULTIPLE for t in task.tables}
    unknown = sorted(set(splittable) - set(task.names))
    if unknown:
        raise ValueError(f"splittable tables {unknown} are not in the task")
    return {name: max(SHARD_COLUMN_MULTIPLE, int(w or 0)) for name, w in splittable.items()}


def _forced_counts(task: Task, allowed: Mapping[str, int], limit: int) -> dict[str, int]:
    """The fewest shards that fit the largest device, for every table too big for it."""
    biggest = max(task.memory)
    counts: dict[str, int] = {}
    for spec in task.tables:
        if spec.size_bytes <= biggest:
            continue
        if spec.name not in allowed:
            raise ValueError(
                f"table {spec.name!r} ({spec.size_bytes} bytes) is bigger than every device "
                f"({biggest} bytes at most) and may not be split column-wise"
            )
        options = split_counts(spec, limit, allowed[spec.name])
        fits = [n for n in options if column_shards(spec, n)[0].size_bytes <= biggest]
        if not fits:
            raise ValueError(
                f"table {spec.name!r} ({spec.size_bytes} bytes, dim {spec.dim}) fits no "
                f"device ({biggest} bytes at most) even cut into the most column-wise "
                f"shards allowed ({options[-1] if options else 1}, at most {limit}: one per "
                "device); add devices or memory"
            )
        counts[spec.name] = fits[0]
    return counts


def _place(agent: Any, task: Task, mode: str | None, num_samples: int, seed: int) -> list[int]:
    kwargs: dict[str, Any] = {"num_samples": num_samples, "seed": seed}
    if mode is not None:
        kwargs["mode"] = mode
    return [int(d) for d in agent.place(task, **kwargs)]


def _place_fitting(agent, task, counts, next_count, mode, num_samples, seed):
    """Place the shard task, splitting the table with the largest shards further while the
    agent finds no placement."""
    error: ValueError | None = None
    for _ in range(FIT_ATTEMPTS + 1):
        sharded = shard_task(task, counts)
        try:
            return sharded, _place(agent, sharded.shards, mode, num_samples, seed)
        except ValueError as exc:  # the policy's PlacementError is a ValueError
            error = exc
        tables = sharded.shards.tables
        for k in sorted(range(len(tables)), key=lambda k: -tables[k].size_bytes):
            name = task.tables[sharded.owner[k]].name
            n = next_count(name, counts.get(name, 1) + 1)
            if n is not None:
                counts = {**counts, name: n}
                break
        else:
            break
    raise ValueError(f"no placement fits, even with column-wise splits: {error}") from error


def _improve(agent: Any, best: SplitPlan, next_count) -> SplitPlan:
    """Split the costliest tables on the predicted bottleneck device while the cost network
    says the step falls."""
    task = best.sharded.task
    for _ in range(SEARCH_ROUNDS):
        shards = best.sharded.shards
        pred = agent.predict(shards, best.placement)
        load = np.asarray(pred.total_ms, dtype=np.float64)
        hot = int(np.argmax(load))
        costs = np.asarray(agent.table_costs(shards), dtype=np.float64)
        on_hot: dict[int, float] = {}
        for k, d in enumerate(best.placement):
            if d == hot:
                i = best.sharded.owner[k]
                on_hot[i] = on_hot.get(i, 0.0) + float(costs[k])
        ranked = sorted(on_hot, key=lambda i: -on_hot[i])
        tried, improved = 0, False
        for i in ranked:
            name = task.tables[i].name
            current = len(best.sharded.columns.get(name, [(0, 0)]))
            n = next_count(name, 2 * current)
            if n is None:
                continue
            tried += 1
            candidate = _resplit(best, i, n, load, costs)
            if candidate is not None:
                ms = float(agent.predict(candidate[0].shards, candidate[1]).step_ms)
                if ms < best.predicted_ms * (1 - MIN_GAIN):
                    best = SplitPlan(candidate[0], candidate[1], ms, best.whole_ms)
                    improved = True
                    break
            if tried >= SEARCH_TABLES:
                break
        if not improved:
            break
    return best


def _resplit(
    best: SplitPlan, table: int, n: int, load: np.ndarray, costs: np.ndarray
) -> tuple[ShardTask, list[int]] | None:
    """Table ``table`` cut into ``n`` shards, the others where they were; the new shards go,
    one at a time, to the least loaded device with room that holds none of them yet
    (``None`` when they do not fit)."""
    old = best.sharded
    task = old.task
    name = task.tables[table].name
    load = load.copy()
    table_ms = 0.0
    for k, d in enumerate(best.placement):
        if old.owner[k] == table:
            load[d] -= costs[k]
            table_ms += costs[k]
    columns = {**old.columns, name: n}
    new = shard_task(task, columns)
    mine = [k for k, i in enumerate(new.owner) if i == table]
    others = iter(d for k, d in enumerate(best.placement) if old.owner[k] != table)
    placement = [-1 if i == table else next(others) for i in new.owner]
    free = np.asarray(task.memory, dtype=np.int64) - np.asarray(
        device_bytes(new.shards, [max(d, 0) for d in placement]), dtype=np.int64
    )
    # device_bytes above counted the unplaced shards on device 0: give that back
    free[0] += sum(new.shards.tables[k].size_bytes for k in mine)
    used: set[int] = set()
    for k in mine:
        size = new.shards.tables[k].size_bytes
        legal = [d for d in range(task.num_devices) if d not in used and free[d] >= size]
        if not legal:
            return None
        d = min(legal, key=lambda x: load[x])
        placement[k] = d
        used.add(d)
        free[d] -= size
        load[d] += table_ms / n
    return new, placement
