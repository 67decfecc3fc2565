"""The generalisation benchmark's methods and how each plans a task: the heuristics,
TorchRec, DreamShard's modes, measured-greedy and two random placements (all from the
placers' registry), and, with calibration budgets, the agent calibrated on this machine
(``calibrated_B``) and verified by measuring (``calibrated_B_verifyK``), through
:func:`~torchrec_dreamshard.calibration.plan_task`. Each budget has its own calibration
store, so a budget's model knows only what it measured.

``default`` is ``DreamShardPlanner`` with no flags, a user's first plan on this machine
(:func:`plan_default`: a fresh cache per task, the planner's own budget), and
``default_unverified`` the plan its policy chose before the verification step.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from torchrec_dreamshard.calibration import CalibrationConfig
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.evaluation.placers import PlacingInputs, plan_each
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.policy import DreamShard
from torchrec_dreamshard.policy.heuristics import HEURISTICS

METHODS = (
    *HEURISTICS,
    "torchrec",
    "dreamshard",
    "dreamshard_split",
    "dreamshard_greedy",
    "dreamshard_search",
    "measured_greedy",
)
RANDOM = ("random_0", "random_1")  # planned too, so the cost network ranks more plans


def methods(
    calibrate_budget: Sequence[float] = (), verify: int = 0, default: bool = False
) -> list[str]:
    """The methods a run reports: :data:`METHODS`, then per calibration budget B
    ``calibrated_B`` and, with ``verify`` K, ``calibrated_B_verifyK``; with ``default``,
    ``default`` and ``default_unverified``."""
    out = list(METHODS)
    for budget in calibrate_budget:
        out.append(f"calibrated_{budget:g}")
        if verify:
            out.append(f"calibrated_{budget:g}_verify{verify}")
    if default:
        out += ["default", "default_unverified"]
    return out


def plan_default(agent: DreamShard, task: Task, plans: dict, secs: dict) -> None:
    """Plan ``task`` as a user's first plan with ``DreamShardPlanner`` and no flags
    (:func:`~harness.default_planning.plan_whole_tables`), and add
    what it did to ``plans`` and ``secs``.

    The planner is given ``agent`` (the run's checkpoint: the bundled one unless the run
    names another, what a user's planner loads) and no other flag but two, which make it
    plan what the task means and what the harness measures:

    * every table is held to table-wise on the fused kernel (``dreamshard plan
      --no-splits``): the harness measures whole tables, a device per table;
    * ``storage_reservation=FixedPercentageStorageReservation(0.0)``: a task's memory is
      the memory left for its tables (the families draw it against the tables' weights),
      that is, what a storage reservation left, so nothing more is reserved. With
      TorchRec's default reservation (15% and the dense and input estimates) the planner
      finds no plan on 5 of the 11 families' first tasks (pool, zipf, tight, bursty,
      heavy_pooling), where the task's memory is tight by design; with nothing reserved it
      plans 10 of them. The planner's own enumerator and TorchRec's storage estimate
      (weights, optimizer state, input and output buffers) are kept: a user's enumerator
      would replace ours and drop its type choice. So a task whose tables fit the memory
      by their weights but not by TorchRec's estimate has no plan here (the first
      ``heavy_pooling`` task: its pooling's input buffers take the estimate 0.04% past
      the devices' memory), as TorchRec's own planner has none.

    Each task is planned from a fresh, empty cache directory of its own (``cache_dir``),
    deleted after: every plan is a first plan on this machine, measuring its profile (and
    calibrating and verifying where the checkpoint misprices the machine) from nothing,
    within the planner's default budget for a first plan
    (:data:`~torchrec_dreamshard.planner.steps.profile_step.FIRST_PLAN_BUDGET_S`).

    Adds ``plans["default"]`` (the device per table, in task order; ``None`` where the
    planner found no plan, with ``secs["default_error"]`` saying why),
    ``plans["default_unverified"]`` (the policy's choice in TorchRec's loop, before the
    verification: the same where nothing was verified or the verification kept it),
    ``secs["default"]`` (the seconds of ``plan()``, measuring included),
    ``secs["default_budget_s"]`` (the budget it planned within) and
    ``secs["default_adaptation"]`` (the planner's ``adaptation``: what it measured, spent
    and skipped, and the verification's ``margins``)."""
    from torchrec.distributed.planner.storage_reservations import (
        FixedPercentageStorageReservation,
    )

    from torchrec_dreamshard.data.tasks import NoPlanError
    from torchrec_dreamshard.planner.steps.profile_step import FIRST_PLAN_BUDGET_S

    from harness.default_planning import plan_whole_tables

    secs["default_budget_s"] = FIRST_PLAN_BUDGET_S
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="dreamshard_first_plan_") as cache:
            out = plan_whole_tables(
                task,
                Path(cache),
                agent=agent,
                storage_reservation=FixedPercentageStorageReservation(0.0),
            )
    except NoPlanError as exc:
        secs["default"] = time.perf_counter() - start
        secs["default_error"] = str(exc)
        plans["default"] = plans["default_unverified"] = None
        return
    plans["default"], plans["default_unverified"] = out.placement, out.unverified
    secs["default"], secs["default_adaptation"] = out.seconds, out.adaptation


def plan_every_method(
    agent: DreamShard, task: Task, config: MeasureConfig, seed: int
) -> tuple[dict, dict]:
    """Every method's plan (``None`` where it finds none) and planning seconds, with the
    safe mode's safety-net report (``secs["safe_report"]``)."""
    inputs = PlacingInputs(agent=agent, measure=config)
    plans, secs = plan_each([*HEURISTICS, "torchrec", "dreamshard"], task, seed, inputs)
    report = agent.last_report.to_dict() if agent.last_report else None
    rest = ["dreamshard_split", "dreamshard_greedy", "dreamshard_search", "measured_greedy"]
    more = [plan_each(rest, task, seed, inputs)]
    more += [
        plan_each(["random"], task, seed + 1 + k, labels=[label]) for k, label in enumerate(RANDOM)
    ]
    for p, s in more:
        plans.update(p)
        secs.update(s)
    secs["safe_report"] = report
    return plans, secs


def calibration_store(name: str, budget: float) -> Path:
    """The calibration store of run ``name``'s budget (beside the default store)."""
    from torchrec_dreamshard.calibration import default_store_path

    return default_store_path().parent / f"bench_{name}_b{budget:g}.sqlite"


def calibration_config(name: str, budget: float, seed: int) -> CalibrationConfig:
    store = calibration_store(name, budget)
    store.parent.mkdir(parents=True, exist_ok=True)
    return CalibrationConfig(budget_s=budget, store=store, seed=seed, progress=False)


def plan_calibrated(
    agent: DreamShard,
    task: Task,
    config: MeasureConfig,
    run: argparse.Namespace,
    seed: int,
    plans: dict,
    secs: dict,
) -> None:
    """Calibrate at every budget of ``run.calibrate_budget``, place (safe mode) and, with
    ``run.verify``, verify, as the planner does (:func:`~torchrec_dreamshard.calibration.
    plan_task`); adds the plans (the calibrated model's choice, then the verification's)
    and the seconds each step took (placing: what the rest took)."""
    from torchrec_dreamshard.calibration import VerificationSettings, plan_task
    from torchrec_dreamshard.policy.protocol import PlaceSettings

    for budget in run.calibrate_budget:
        name = f"calibrated_{budget:g}"
        t0 = time.perf_counter()
        out = plan_task(
            agent,
            task,
            how=PlaceSettings(mode="safe", seed=seed),
            calibration=calibration_config(run.name, budget, seed),
            verification=VerificationSettings(k=run.verify, config=config),
        )
        wall, res, ver = time.perf_counter() - t0, out.calibration, out.verification
        plans[name] = [int(d) for d in out.chosen]
        secs[f"{name}_calibrate"], secs[f"{name}_kernels"] = res.seconds, res.samples
        secs[name] = wall - res.seconds - (ver.seconds if ver else 0.0)
        if ver is not None:
            plans[f"{name}_verify{run.verify}"] = [int(d) for d in out.placement]
            secs[f"{name}_verify{run.verify}"] = ver.seconds


def calibrated_agents(agent: DreamShard, task: Task, run: argparse.Namespace, seed: int) -> dict:
    """The calibrated agent of every budget, rebuilt from its store: the kernels the
    planning run measured, nothing measured again (a budget cut short then leaves kernels
    unmeasured; they stay so)."""
    from torchrec_dreamshard.calibration import calibrate

    out = {}
    for budget in run.calibrate_budget:
        config = calibration_config(run.name, budget, seed)
        config = dataclasses.replace(config, measure_missing=False)
        res = calibrate(agent, task, config)
        out[f"cal{budget:g}"] = res.agent
    return out
