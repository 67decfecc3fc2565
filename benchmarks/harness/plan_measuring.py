"""Plans measured on real kernels for the benchmarks: one measurement's costs, and every
task's distinct plans in interleaved rounds whose results are saved as they come (so a
rerun resumes).

A plan is a placement list (a device per table) or, for a plan that cuts tables
column-wise, ``{"columns": {table: shards}, "placement": [device per shard]}``; such a plan
is measured as the task of its shards.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torchrec_dreamshard.data.splits import shard_task
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure import MeasureConfig

from harness.results_files import machine, save_raw

Plan = list[int] | dict[str, Any]


def measure_costs(task: Task, placement: Sequence[int], config: MeasureConfig) -> dict:
    """One measurement of ``placement`` on real kernels: ``dev``, each device's
    ``[fwd, bwd, comm]`` ms; ``compute``, the slowest device's fwd + bwd; ``step``, its
    fwd + bwd + comm.

    Raises:
        RuntimeError: the measurement failed (its error is kept).
    """
    from torchrec_dreamshard.cost.collective_models import local_all_to_all
    from torchrec_dreamshard.measure import measure_placement

    comm = local_all_to_all(task.num_devices, path=config.comm_model_path)
    m = measure_placement(task, list(placement), config, comm=comm)
    if not m.ok:
        raise RuntimeError(f"measurement failed: {m.error}")
    dev = [[d.fwd_ms, d.bwd_ms, d.comm_ms] for d in m.per_device]
    return {
        "compute": max(f + b for f, b, _ in dev),
        "step": max(f + b + c for f, b, c in dev),
        "dev": dev,
    }


def measure_fn(
    config: MeasureConfig | None = None,
) -> Callable[[Task, Sequence[int]], tuple[float, list[float], float]]:
    """``(task, placement) -> (step_ms, per-device totals, reference_ms)`` on real kernels."""
    from torchrec_dreamshard.cost.collective_models import local_all_to_all
    from torchrec_dreamshard.measure import measure_placement

    config = config or MeasureConfig()

    def measure(task: Task, placement: Sequence[int]) -> tuple[float, list[float], float]:
        comm = local_all_to_all(task.num_devices, path=config.comm_model_path)
        m = measure_placement(task, list(placement), config, comm=comm)
        if not m.ok:
            raise RuntimeError(f"measurement failed: {m.error}")
        return m.step_ms, [d.total_ms for d in m.per_device], m.reference_ms

    return measure


def plan_key(plan: Plan) -> str:
    """A plan's key in the rounds (and in the raw results): its JSON, keys sorted."""
    return json.dumps(plan, sort_keys=True)


def plan_target(task: Task, plan: Plan) -> tuple[Task, list[int]]:
    """``(task, placement)`` to measure or predict: a plan with shards is the task of its
    shards."""
    if isinstance(plan, dict):
        return shard_task(task, plan["columns"]).shards, plan["placement"]
    return task, plan


def distinct_plans(entry: dict) -> list[Plan]:
    """The distinct plans of a task's raw entry (``entry["plans"]``: by method, ``None``
    where a method found none), in key order."""
    found = {plan_key(p): p for p in entry["plans"].values() if p is not None}
    return [found[k] for k in sorted(found)]


def measure_rounds(
    tasks: Sequence[tuple[str, Task]],
    raw: dict,
    config: MeasureConfig,
    rounds: int,
    path: Path,
    start: float,
    wall_before: float,
) -> None:
    """Every task's distinct plans in ``rounds`` interleaved rounds (``measure_in_rounds``;
    what an earlier run measured is kept), appended to each task's ``rounds`` in ``raw``;
    ``raw`` saved to ``path`` after every task's round, with the wall time (``wall_before``
    plus the seconds since ``start``) and the machine's state after every round."""
    from torchrec_dreamshard.measure import measure_in_rounds

    entries = raw["tasks"]
    plans = [{plan_key(p): p for p in distinct_plans(e)} for e in entries]

    def measure(ti: int, key: str) -> dict:
        return measure_costs(*plan_target(tasks[ti][1], plans[ti][key]), config)

    def keep(ti: int, r: int, results: dict) -> None:
        entries[ti]["rounds"].append(results)
        save_raw(path, raw)

    def ended(r: int) -> None:
        raw["wall_s"], raw["machine"] = wall_before + time.perf_counter() - start, machine()
        save_raw(path, raw)
        print(f"round {r + 1}/{rounds} measured", flush=True)

    done = [list(e["rounds"]) for e in entries]
    measure_in_rounds(
        [list(p) for p in plans], measure, rounds, done=done, on_group=keep, on_round=ended
    )
