"""The resumable runner of the generalisation benchmark (and the safety-net study): raw
results saved after every task and every round, a rerun with the same settings resuming
from them, and every task's distinct plans measured in interleaved rounds."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from _agent_common import machine, measure_costs

from torchrec_dreamshard.data.splits import shard_task


def measure_config():
    from torchrec_dreamshard.measure import MeasureConfig

    return MeasureConfig()


def load_raw(path: Path, settings: dict) -> dict:
    if path.exists():
        raw = json.loads(path.read_text())
        if raw.get("settings") == settings:
            return raw
        print(f"{path.name} holds other settings; starting afresh", flush=True)
    return {"settings": settings, "tasks": []}


def save_raw(path: Path, raw: dict) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(raw) + "\n")
    os.replace(tmp, path)


def plan_key(plan) -> str:
    """A plan's key in the rounds: its placement list, or for a plan with column-wise
    shards ``{"columns": {table: shards}, "placement": [device per shard]}``."""
    return json.dumps(plan, sort_keys=True)


def plan_target(task, plan) -> tuple:
    """``(task, placement)`` to measure or predict: a plan with shards is the task of its
    shards."""
    if isinstance(plan, dict):
        return shard_task(task, plan["columns"]).shards, plan["placement"]
    return task, plan


def distinct_plans(entry: dict) -> list:
    """The task's distinct plans, in key order."""
    found = {plan_key(p): p for p in entry["plans"].values() if p is not None}
    return [found[k] for k in sorted(found)]


def measure_rounds(tasks, raw, config, args, path, start: float, wall_before: float) -> None:
    """Every task's distinct plans in ``args.rounds`` interleaved rounds
    (``measure_in_rounds``; what an earlier run measured is kept), appended to each task's
    rounds; the raw results saved after every task's round, with the wall time and the
    machine's state after every round."""
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
        print(f"round {r + 1}/{args.rounds} measured", flush=True)

    done = [list(e["rounds"]) for e in entries]
    measure_in_rounds(
        [list(p) for p in plans], measure, args.rounds, done=done, on_group=keep, on_round=ended
    )
