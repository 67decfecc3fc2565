"""The generalisation benchmark's roster: its tasks (every family's test draws) and its
methods (the heuristics, TorchRec, DreamShard's modes, measured-greedy, random placements
and, with ``--calibrate-budget``, the calibrated agent), and how each method plans a task.
The safety-net study and the plan regression draw the same tasks."""

from __future__ import annotations

import time
from pathlib import Path

from _agent_common import single_ms

from torchrec_dreamshard.data import families
from torchrec_dreamshard.planner import baselines
from torchrec_dreamshard.policy.safety_net import memory_aware_greedy
from torchrec_dreamshard.policy.split_search import plan_with_splits

HEURISTICS = list(baselines.HEURISTICS)
METHODS = [
    *HEURISTICS, "torchrec", "dreamshard", "dreamshard_split", "dreamshard_greedy",
    "dreamshard_search", "measured_greedy",
]  # fmt: skip
RANDOM = ["random_0", "random_1"]
PER_FAMILY = 3  # test tasks per family


def roster(names=None, per_family: int = PER_FAMILY, seed: int = 0) -> list:
    """``[(family, task)]``: the benchmark's tasks, ``per_family`` test draws of each family
    in ``names`` (default: every family); task ``i`` is planned with seed ``seed + i``."""
    names = list(families.FAMILIES) if names is None else list(names)
    return families.draw_tasks(names, per_family, "test", seed)


def measured_single_costs(task, config) -> list[float]:
    """Each table alone on one device: measured fwd + bwd (ms)."""
    return [single_ms(t, task.batch_size, config) for t in task.tables]


def plan_every_method(agent, task, config, seed: int) -> tuple[dict, dict]:
    """Every method's placement (``None`` where it finds no plan) and planning seconds."""
    plans, secs = {}, {}

    def timed(name, fn):
        t0 = time.perf_counter()
        try:
            plans[name] = [int(d) for d in fn()]
        except baselines.NoPlanError as exc:
            plans[name], secs[f"{name}_error"] = None, str(exc)
        secs[name] = time.perf_counter() - t0

    for name in HEURISTICS + ["torchrec"]:
        timed(name, lambda name=name: baselines.place(name, task, seed=seed))
    timed("dreamshard", lambda: agent.place(task, seed=seed))  # the default (safe) mode
    entry_report = agent.last_report.to_dict() if agent.last_report else None
    t0 = time.perf_counter()
    try:
        found = plan_with_splits(agent, task, seed=seed)  # what `dreamshard plan` does
        placement = [int(d) for d in found.placement]
        plans["dreamshard_split"] = (
            {"columns": found.sharded.counts, "placement": placement}
            if found.sharded.columns
            else placement
        )
    except ValueError as exc:
        plans["dreamshard_split"], secs["dreamshard_split_error"] = None, str(exc)
    secs["dreamshard_split"] = time.perf_counter() - t0
    timed("dreamshard_greedy", lambda: agent.place(task, mode="greedy", seed=seed))
    timed("dreamshard_search", lambda: agent.place(task, mode="search", seed=seed))
    secs["safe_report"] = entry_report

    def measured_greedy():
        plan = memory_aware_greedy(task, measured_single_costs(task, config))
        if plan is None:
            raise baselines.NoPlanError("no device order fits memory")
        return plan

    timed("measured_greedy", measured_greedy)
    for k, name in enumerate(RANDOM):
        timed(name, lambda k=k: baselines.random_placement(task, seed=seed + 1 + k))
    return plans, secs


def calibration_store(name: str, budget: float) -> Path:
    from torchrec_dreamshard.calibration import default_store_path

    return default_store_path().parent / f"bench_{name}_b{budget:g}.sqlite"


def calibration_config(name: str, budget: float, seed: int):
    from torchrec_dreamshard.calibration import CalibrationConfig

    store = calibration_store(name, budget)
    store.parent.mkdir(parents=True, exist_ok=True)
    return CalibrationConfig(budget_s=budget, store=store, seed=seed, progress=False)


def plan_calibrated(agent, task, config, args, seed: int, plans: dict, secs: dict) -> None:
    """Calibrate at every budget, place (safe mode) and verify; adds the plans and the
    seconds each step took."""
    from torchrec_dreamshard.calibration import calibrate, verify

    for budget in args.calibrate_budget:
        name = f"calibrated_{budget:g}"
        res = calibrate(agent, task, calibration_config(args.name, budget, seed))
        t0 = time.perf_counter()
        plans[name] = [int(d) for d in res.agent.place(task, mode="safe", seed=seed)]
        secs[f"{name}_calibrate"], secs[name] = res.seconds, time.perf_counter() - t0
        secs[f"{name}_kernels"] = res.samples
        if args.verify:
            ver = verify(
                res.agent, task, args.verify, config, seed=seed, extra={"chosen": plans[name]}
            )
            plans[f"{name}_verify{args.verify}"] = [int(d) for d in ver.winner.placement]
            secs[f"{name}_verify{args.verify}"] = ver.seconds


def calibrated_agents(agent, task, args, seed: int) -> dict:
    """The calibrated agent of every budget, rebuilt from its store: the kernels the
    planning run measured, nothing measured again (a budget cut short then leaves kernels
    unmeasured; they stay so)."""
    import dataclasses

    from torchrec_dreamshard.calibration import calibrate

    out = {}
    for budget in args.calibrate_budget:
        config = calibration_config(args.name, budget, seed)
        config = dataclasses.replace(config, measure_missing=False)
        res = calibrate(agent, task, config)
        out[f"cal{budget:g}"] = res.agent
    return out
