"""Statistics of plans measured in interleaved rounds: per task, each method's cost over
the best heuristic's and the cost network's rank agreement with the measurements; per
family, their geometric means and worst tasks.

A task's raw entry (what :mod:`~harness.plan_measuring` fills) holds
``plans`` (by method, ``None`` where it found none), ``secs`` and ``rounds``: per round,
each distinct plan's costs by its key (``compute``, ``step``, ``dev``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from torchrec_dreamshard.cost.fitting import kendall_tau
from torchrec_dreamshard.data import families
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.policy import PlacementAgent
from torchrec_dreamshard.policy.heuristics import HEURISTICS

from harness.plan_measuring import distinct_plans, plan_key, plan_target

KINDS = ("compute", "step")  # max over devices of fwd + bwd; and + the all-to-all


def geomean(values: Iterable[float | None]) -> float:
    """The geometric mean of the finite values (``None`` and ``nan`` left out; ``nan``
    when none is left)."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return float(math.exp(np.mean(np.log(vals)))) if vals else float("nan")


def task_summary(
    agent: PlacementAgent,
    fam_task: tuple[str, Task],
    entry: dict,
    methods: Sequence[str],
    calibrated: Mapping[str, PlacementAgent] | None = None,
) -> dict:
    """Per method of ``methods``: the median over rounds of its cost / the best
    heuristic's, for compute and step; the cost network's tau and MAPE on the task's
    distinct plans (and those of each ``calibrated`` agent, by tag)."""
    fam, task = fam_task
    key = {n: plan_key(p) for n, p in entry["plans"].items() if p is not None}
    costs = {
        kind: {k: np.array([r[k][kind] for r in entry["rounds"]]) for k in entry["rounds"][0]}
        for kind in KINDS
    }
    found = [n for n in HEURISTICS if n in key]
    out = {
        "family": fam,
        "tables": len(task.tables),
        "devices": task.num_devices,
        "batch": task.batch_size,
    }
    for kind, c in costs.items():
        if not found:
            out[kind] = {}
            continue
        best = min(found, key=lambda n: np.median(c[key[n]]))
        out[kind] = {n: float(np.median(c[key[n]] / c[key[best]])) for n in methods if n in key}
        out[f"{kind}_best_heuristic"] = best
    if found:
        out["even_spread"] = even_spread(entry) / float(
            np.median(costs["compute"][key[out["compute_best_heuristic"]]])
        )
    out.update(model_agreement(agent, task, entry, calibrated or {}))
    out["planning_s"] = entry["secs"]
    return out


def model_agreement(
    agent: PlacementAgent, task: Task, entry: dict, calibrated: Mapping[str, PlacementAgent]
) -> dict:
    """The cost network's Kendall tau and MAPE against the measured steps (median over
    rounds) of the task's distinct plans; the same of each calibrated agent (keys suffixed
    with its tag); the measurement's agreement with itself (``noise_tau``)."""
    plans = distinct_plans(entry)
    rounds = entry["rounds"]
    measured = np.array([np.median([r[plan_key(p)]["step"] for r in rounds]) for p in plans])

    def agreement(who: PlacementAgent, tag: str) -> dict:
        pred = np.array([who.predict(*plan_target(task, p)).step_ms for p in plans])
        return {
            f"cost_tau{tag}": kendall_tau(pred.tolist(), measured.tolist()),
            f"cost_mape{tag}": float(np.mean(np.abs(pred - measured) / measured) * 100),
        }

    out = {**agreement(agent, ""), "noise_tau": noise_tau(entry)}
    for tag, cal_agent in calibrated.items():
        out.update(agreement(cal_agent, f"_{tag}"))
    out["num_plans"] = len(plans)
    return out


def noise_tau(entry: dict) -> float:
    """How well the measurement agrees with itself: Kendall tau between one round's
    measured steps of the task's plans and the median of the other rounds', averaged over
    the rounds (``nan`` with fewer than 3 rounds). A cost model ranked against the median
    of noisy rounds can hardly beat it."""
    rounds = entry["rounds"]
    if len(rounds) < 3:
        return float("nan")
    keys = list(rounds[0])
    taus = []
    for r, this in enumerate(rounds):
        rest = [q for k, q in enumerate(rounds) if k != r]
        others = [float(np.median([q[key]["step"] for q in rest])) for key in keys]
        taus.append(kendall_tau([this[key]["step"] for key in keys], others))
    return float(np.mean(taus))


def even_spread(entry: dict) -> float:
    """The headroom estimate: the lowest total compute (sum over devices of fwd + bwd,
    median over rounds) of any plan measured for the task, divided by the number of
    devices, as if that work were spread perfectly evenly. Not a proof (an unmeasured plan
    may do less work in all), but no measured plan's slowest device was below it."""
    totals = [
        float(np.median([sum(f + b for f, b, _ in r[k]["dev"]) for r in entry["rounds"]]))
        / len(entry["rounds"][0][k]["dev"])
        for k in entry["rounds"][0]
    ]
    return min(totals)


def family_rows(rows: list[dict], methods: Sequence[str]) -> dict:
    """Per family: each method's geomean, worst task and tasks without a plan, and the
    cost model's figures."""
    out = {}
    for fam in dict.fromkeys(r["family"] for r in rows):
        rs = [r for r in rows if r["family"] == fam]
        f = {"tasks": len(rs), "heldout": fam in families.HELDOUT_FAMILIES}
        for kind in KINDS:
            f.update(method_figures(rs, kind, methods))
        spread = [r.get("even_spread") for r in rs]
        f["even_spread"] = geomean(spread)
        f["even_spread/worst"] = max((v for v in spread if v), default=float("nan"))
        f["cost_tau"] = float(np.nanmean([r["cost_tau"] for r in rs]))
        f["cost_tau_min"] = float(np.nanmin([r["cost_tau"] for r in rs]))
        f["noise_tau"] = float(np.nanmean([r["noise_tau"] for r in rs]))
        f["cost_mape"] = float(np.mean([r["cost_mape"] for r in rs]))
        for key in [k for k in rs[0] if k.startswith(("cost_tau_cal", "cost_mape_cal"))]:
            f[key] = float(np.nanmean([r[key] for r in rs]))
        for key in [k for k in rs[0]["planning_s"] if k.startswith("calibrated_")]:
            f[f"seconds/{key}"] = float(np.mean([r["planning_s"][key] for r in rs]))
        f.update(default_seconds(rs))
        out[fam] = f
    return out


def default_seconds(rs: list[dict]) -> dict:
    """The default planner's plan seconds over a family's tasks (``rs``) against the budget
    it planned within: ``seconds/default`` (mean), ``/max``, ``/over_budget`` (how many
    tasks took longer) and ``default_budget_s`` (the raw entry's, else the planner's
    :data:`~torchrec_dreamshard.planner.steps.profile_step.FIRST_PLAN_BUDGET_S`); empty where
    the run did not plan as the default does."""
    from torchrec_dreamshard.planner.steps.profile_step import FIRST_PLAN_BUDGET_S

    timed = [r["planning_s"] for r in rs if "default" in r["planning_s"]]
    if not timed:
        return {}
    seconds = [float(t["default"]) for t in timed]
    budgets = [float(t.get("default_budget_s", FIRST_PLAN_BUDGET_S)) for t in timed]
    return {
        "seconds/default": float(np.mean(seconds)),
        "seconds/default/max": max(seconds),
        "seconds/default/over_budget": sum(s > b for s, b in zip(seconds, budgets, strict=True)),
        "default_budget_s": max(budgets),
    }


def method_figures(rs: list[dict], kind: str, methods: Sequence[str]) -> dict:
    """One family's ``kind`` figures of every method: ``kind/method`` (geomean),
    ``/worst``, ``/no_plan``, and DreamShard's worst task over TorchRec's."""
    f: dict = {}
    for n in methods:
        vals = [r[kind].get(n) for r in rs]
        f[f"{kind}/{n}"] = geomean(vals)
        f[f"{kind}/{n}/worst"] = max((v for v in vals if v), default=float("nan"))
        f[f"{kind}/{n}/no_plan"] = sum(v is None for v in vals)
    vs_tr = [r[kind]["dreamshard"] / r[kind]["torchrec"] for r in rs if "torchrec" in r[kind]]
    f[f"{kind}/dreamshard_vs_torchrec_worst"] = max(vs_tr, default=float("nan"))
    return f
