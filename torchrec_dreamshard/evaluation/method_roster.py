"""The generalisation benchmark's methods and how each plans a task: the heuristics,
TorchRec, DreamShard's modes, measured-greedy and two random placements (all from the
placers' registry), and, with calibration budgets, the agent calibrated on this machine
(``calibrated_B``) and verified by measuring (``calibrated_B_verifyK``). Each budget has its
own calibration store, so a budget's model knows only what it measured.

``default`` is what ``DreamShardPlanner`` and ``dreamshard plan`` do with no flags: the
machine check, and where the checkpoint misprices this machine the automatic calibration
and verification (``default_unverified``: the plan the calibrated model chose, before the
verification), in a store of its own.
"""

from __future__ import annotations

import argparse
import dataclasses
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


def plan_default(
    agent: DreamShard, task: Task, name: str, seed: int, plans: dict, secs: dict
) -> None:
    """The default planner's placement (``default``), the calibrated model's choice before
    verification (``default_unverified``, the same where nothing was verified) and what
    the default did (``secs["default_adaptation"]``)."""
    from torchrec_dreamshard.calibration import CalibratingAgent
    from torchrec_dreamshard.calibration.auto import AUTO_BUDGET_S, measured_reference_ms

    config = calibration_config(f"{name}_default", AUTO_BUDGET_S, seed)
    wrapped = CalibratingAgent(
        agent, config, verify_k=None, progress=False, auto=measured_reference_ms
    )
    t0 = time.perf_counter()
    plans["default"] = [int(d) for d in wrapped.place(task, mode="safe", seed=seed)]
    secs["default"] = time.perf_counter() - t0
    secs["default_adaptation"] = wrapped.adaptation()
    outcome = wrapped.last_outcome
    plans["default_unverified"] = [int(d) for d in outcome.chosen] if outcome else plans["default"]


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
