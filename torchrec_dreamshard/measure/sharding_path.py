"""What a sharding path costs a step beyond its kernels and collectives: DMP steps of tiny
tables, all data-parallel against the first table-wise, on the job's group or 2 spawned ranks."""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torchrec_dreamshard.measure.gate import check_may_measure
from torchrec_dreamshard.measure.group_tasks import run_on_group
from torchrec_dreamshard.measure.sharding_path_rank import run_path_rounds
from torchrec_dreamshard.ranks.interpreters import RankProcessError, run_module_ranks
from torchrec_dreamshard.ranks.job_group import JobGroup, active_group, group_task
from torchrec_dreamshard.ranks.spawn import check_may_spawn, free_port

PATH_TABLES = ((64, 8, 1), (64, 8, 1), (64, 8, 1), (64, 8, 1))  # (rows, dim, ids per bag)
PATH_WORLD = 2  # ranks
PATH_BATCH = 512  # samples per rank per step (the step timer's)


class ShardingPathError(RuntimeError):
    """A rank of the sharding-path measurement failed or ran past its time."""


@dataclass(frozen=True)
class PathTimings:
    """Both plans' mean step (ms) in each round: ``data_parallel`` (every path table) and
    ``one_table_wise`` (the first table-wise on rank 0)."""

    data_parallel: tuple[float, ...]
    one_table_wise: tuple[float, ...]
    tables: tuple[tuple[int, int, int], ...] = PATH_TABLES
    world_size: int = PATH_WORLD
    batch_size: int = PATH_BATCH
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.data_parallel) != len(self.one_table_wise) or not self.data_parallel:
            raise ValueError("the two plans need the same number of rounds, at least one")

    @property
    def deltas_ms(self) -> list[float]:
        """Per round, the table-wise plan's step minus the data-parallel one's."""
        return [b - a for a, b in zip(self.data_parallel, self.one_table_wise, strict=True)]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PathTimings:
        return cls(
            data_parallel=tuple(float(x) for x in data["data_parallel"]),
            one_table_wise=tuple(float(x) for x in data["one_table_wise"]),
            tables=tuple(tuple(int(v) for v in t) for t in data["tables"]),  # type: ignore[misc]
            world_size=int(data["world_size"]),
            batch_size=int(data["batch_size"]),
            meta=dict(data.get("meta") or {}),
        )


def time_sharding_path(
    rounds: int = 8, warmup: int = 3, steps: int = 20, timeout_s: float = 90.0
) -> PathTimings:
    """Time both plans in ``rounds`` interleaved rounds of ``warmup`` + ``steps`` steps, on
    the driven job's group, else on :data:`PATH_WORLD` spawned gloo ranks.

    Raises:
        ShardingPathError: a started rank failed or ``timeout_s`` passed.
        ValueError: inside a distributed job that is not driving its group.
    """
    check_may_measure("time_sharding_path")
    if rounds < 1 or steps < 1 or warmup < 0:
        raise ValueError(f"need rounds >= 1, steps >= 1, warmup >= 0; got {rounds, steps, warmup}")
    job = {
        "tables": [list(t) for t in PATH_TABLES],
        "batch_size": PATH_BATCH,
        "rounds": rounds,
        "warmup": warmup,
        "steps": steps,
    }
    start = time.perf_counter()
    group = active_group()
    if group is not None:
        times, world, where = run_on_group(_group_path_rounds, job)[0], group.world, group.backend
    else:
        check_may_spawn("timing the sharding path")
        times, world, where = _spawned_path_rounds(job, timeout_s), PATH_WORLD, "spawned gloo"
    return PathTimings(
        data_parallel=tuple(times["data_parallel"]),
        one_table_wise=tuple(times["one_table_wise"]),
        world_size=world,
        meta={
            "rounds": rounds,
            "warmup": warmup,
            "steps": steps,
            "ranks": where,
            "seconds": time.perf_counter() - start,
        },
    )


@group_task
def _group_path_rounds(group: JobGroup, job: dict[str, Any]) -> dict[str, list[float]]:
    local = group.hosts.count(group.hosts[group.rank])
    return run_path_rounds(job, group.pg, group.device, local)


def _spawned_path_rounds(job: dict[str, Any], timeout_s: float) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "path.json"
        spawned = {**job, "world": PATH_WORLD, "port": free_port(), "out": str(out)}
        module = "torchrec_dreamshard.measure.sharding_path_rank"
        try:
            run_module_ranks(module, spawned, Path(tmp), timeout_s, "sharding-path")
        except RankProcessError as exc:
            raise ShardingPathError(str(exc)) from exc
        return json.loads(out.read_text())
