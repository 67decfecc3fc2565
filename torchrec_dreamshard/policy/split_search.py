"""The split search: placing a task while cutting tables column-wise where that fits or
pays (:func:`plan_with_splits`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from torchrec_dreamshard.data.splits import (
    MAX_SHARDS,
    SHARD_COLUMN_MULTIPLE,
    ShardTask,
    column_shards,
    shard_task,
    split_counts,
)
from torchrec_dreamshard.data.tasks import InsufficientMemoryError, Task, device_bytes
from torchrec_dreamshard.policy.protocol import PlaceSettings

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy.protocol import CostPrediction, PlacementAgent

SEARCH_ROUNDS = 8  # rounds of the split search
SEARCH_TABLES = 2  # tables tried per round: the costliest on the bottleneck device
MIN_GAIN = 0.03  # relative fall of the predicted cost for a split to be kept
FIT_ATTEMPTS = 12  # further splits tried while the policy finds no placement
REPLACE_MAX_TABLES = 400  # the policy re-places the shard task when it has at most this many
TRIAL_REPLACE_MAX_TABLES = 100  # ... and each trial split, on tasks of at most this many


@dataclass
class SplitPlan:
    """What :func:`plan_with_splits` found.

    Attributes:
        sharded: the task of shards.
        placement: a device per table of ``sharded.shards``.
        predicted_ms: the cost network's step cost of it.
        whole_ms: the predicted step of the whole-table start (``None``: none fits).
    """

    sharded: ShardTask
    placement: list[int]
    predicted_ms: float
    whole_ms: float | None


def plan_with_splits(
    agent: PlacementAgent,
    task: Task,
    how: PlaceSettings | None = None,
    splittable: Mapping[str, int] | None = None,
    max_shards: int = MAX_SHARDS,
) -> SplitPlan:
    """Place ``task``, splitting tables column-wise where that fits or pays.

    Oversized tables are cut into the fewest shards that fit; while no placement is found
    the largest shards are split further; then for :data:`SEARCH_ROUNDS` rounds the
    costliest bottleneck tables are tried in twice as many shards, kept when the predicted
    step (or, at no higher step, the slowest compute) falls by :data:`MIN_GAIN`.

    Args:
        task: may hold tables bigger than every device (``allow_oversized``).
        how: how to call ``agent.place`` (``None``: the agent's defaults, seed 0).
        splittable: tables that may be split, each with its minimum shard width (``None``:
            every table, minimum :data:`SHARD_COLUMN_MULTIPLE`).
        max_shards: shards of one table at most (capped at the number of devices).

    Raises:
        InsufficientMemoryError: an oversized table that cannot be split small enough, or no
            placement even after splitting.
        ValueError: ``splittable`` names a table the task lacks.
    """
    limit = max(1, min(max_shards, task.num_devices))
    allowed = _splittable(task, splittable)

    def next_count(name: str, at_least: int) -> int | None:
        if name not in allowed:
            return None
        counts = [n for n in split_counts(specs[name], limit, allowed[name]) if n >= at_least]
        return counts[0] if counts else None

    specs = {t.name: t for t in task.tables}
    counts = _forced_counts(task, allowed, limit)
    how = how if how is not None else PlaceSettings()
    sharded, placement = _place_fitting(agent, task, counts, next_count, how)
    # trial placements measure nothing and must not leave their safety-net report behind
    placer = agent.without_measuring
    report = placer.last_report
    prediction = agent.predict(sharded.shards, placement)
    whole_ms = None if sharded.columns else float(prediction.step_ms)
    best = SplitPlan(sharded, placement, float(prediction.step_ms), whole_ms)
    replace = None
    if len(task.tables) <= TRIAL_REPLACE_MAX_TABLES:

        def replace(shards: Task) -> list[int]:
            return how.place(placer, shards)

    best = _improve(agent, best, next_count, replace)
    if best.sharded.columns and len(best.sharded.shards.tables) <= REPLACE_MAX_TABLES:
        again = how.place(placer, best.sharded.shards)
        again_ms = float(agent.predict(best.sharded.shards, again).step_ms)
        if again_ms < best.predicted_ms and _shards_apart(best.sharded, again):
            best = SplitPlan(best.sharded, again, again_ms, best.whole_ms)
    if not best.sharded.columns:
        placer.last_report = report
    return best


def fitting_task(task: Task, max_shards: int = MAX_SHARDS) -> Task:
    """``task`` with every oversized table cut into the fewest shards that fit a device
    (an ``InsufficientMemoryError`` for one that cannot be)."""
    limit = max(1, min(max_shards, task.num_devices))
    counts = _forced_counts(task, _splittable(task, None), limit)
    return shard_task(task, counts).shards if counts else task


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
            raise InsufficientMemoryError(
                f"table {spec.name!r} ({spec.size_bytes} bytes) is bigger than every device "
                f"({biggest} bytes at most) and may not be split column-wise"
            )
        options = split_counts(spec, limit, allowed[spec.name])
        fits = [n for n in options if column_shards(spec, n)[0].size_bytes <= biggest]
        if not fits:
            raise InsufficientMemoryError(
                f"table {spec.name!r} ({spec.size_bytes} bytes, dim {spec.dim}) fits no "
                f"device ({biggest} bytes at most) even cut into the most column-wise "
                f"shards allowed ({options[-1] if options else 1}, at most {limit}: one per "
                "device); add devices or memory"
            )
        counts[spec.name] = fits[0]
    return counts


def _place_fitting(agent: PlacementAgent, task: Task, counts, next_count, how: PlaceSettings):
    """Place the shard task, splitting the largest-shard table further until it fits."""
    error: InsufficientMemoryError | None = None
    for _ in range(FIT_ATTEMPTS + 1):
        sharded = shard_task(task, counts)
        try:
            return sharded, how.place(agent, sharded.shards)
        except InsufficientMemoryError as exc:  # the policy's PlacementError is one
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
    raise InsufficientMemoryError(
        f"no placement fits, even with column-wise splits: {error}"
    ) from error


def _improve(agent: PlacementAgent, best: SplitPlan, next_count, replace=None) -> SplitPlan:
    """Split the costliest bottleneck tables while the prediction improves, one per round."""
    for _ in range(SEARCH_ROUNDS):
        found = _split_once(agent, best, next_count, replace)
        if found is None:
            break
        best = found
    return best


def _split_once(agent: PlacementAgent, best: SplitPlan, next_count, replace) -> SplitPlan | None:
    """The first split rated better than ``best``, from the step's then the compute's
    bottleneck device."""
    task, shards = best.sharded.task, best.sharded.shards
    pred = agent.predict(shards, best.placement)
    load = np.asarray(pred.total_ms, dtype=np.float64)
    compute = _compute(pred)
    costs = np.asarray(agent.table_costs(shards), dtype=np.float64)
    for hot in dict.fromkeys([int(np.argmax(load)), int(np.argmax(compute))]):
        on_hot: dict[int, float] = {}
        for k, d in enumerate(best.placement):
            if d == hot:
                i = best.sharded.owner[k]
                on_hot[i] = on_hot.get(i, 0.0) + float(costs[k])
        tried = 0
        for i in sorted(on_hot, key=lambda i: -on_hot[i]):
            name = task.tables[i].name
            n = next_count(name, 2 * len(best.sharded.columns.get(name, [(0, 0)])))
            if n is None:
                continue
            for candidate in _candidates(best, i, n, load, compute, costs, replace):
                new = agent.predict(candidate[0].shards, candidate[1])
                if _better(new, pred):
                    return SplitPlan(candidate[0], candidate[1], new.step_ms, best.whole_ms)
            tried += 1
            if tried >= SEARCH_TABLES:
                break
    return None


def _candidates(best, table, n, load, compute, costs, replace):
    """Placements of ``best`` with ``table`` in ``n`` shards: on the lightest devices by
    total, then by compute, then the policy's re-placement."""
    for by in (load, compute):
        candidate = _resplit(best, table, n, by, costs)
        if candidate is not None:
            yield candidate
    if replace is not None:
        sharded = shard_task(
            best.sharded.task, {**best.sharded.columns, best.sharded.task.tables[table].name: n}
        )
        try:
            placement = replace(sharded.shards)
        except InsufficientMemoryError:  # the policy finds no placement of these shards
            return
        if _shards_apart(sharded, placement):
            yield sharded, placement


def _shards_apart(sharded: ShardTask, placement: Sequence[int]) -> bool:
    """Whether every split table's shards are on as many devices as it has shards."""
    pairs = set(zip(sharded.owner, (int(d) for d in placement), strict=True))
    return len(pairs) == len(sharded.owner)


def _compute(pred: CostPrediction) -> np.ndarray:
    return np.asarray(pred.fwd_ms, dtype=np.float64) + np.asarray(pred.bwd_ms, dtype=np.float64)


def _better(new: CostPrediction, old: CostPrediction) -> bool:
    """Whether ``new`` beats ``old`` by :data:`MIN_GAIN` in step, or in slowest compute at no
    higher step."""
    if new.step_ms < old.step_ms * (1 - MIN_GAIN):
        return True
    return new.step_ms <= old.step_ms and float(np.max(_compute(new))) < float(
        np.max(_compute(old))
    ) * (1 - MIN_GAIN)


def _resplit(
    best: SplitPlan, table: int, n: int, load: np.ndarray, costs: np.ndarray
) -> tuple[ShardTask, list[int]] | None:
    """``table`` cut into ``n`` shards, each on the least loaded device with room that holds
    none of them yet (``None``: they do not fit)."""
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
