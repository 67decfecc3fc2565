"""The generalisation benchmark's statistics: per task, each method's cost over the best
heuristic's and the cost network's rank agreement with the measurements; per family, their
geometric means and worst tasks."""

from __future__ import annotations

import numpy as np
from _agent_common import geomean
from _roster import HEURISTICS, METHODS
from _runner import distinct_plans, plan_key, plan_target

from torchrec_dreamshard.cost.fitting import kendall_tau
from torchrec_dreamshard.data import families


def task_summary(agent, fam_task, entry, calibrated: dict | None = None) -> dict:
    """Per method: median over rounds of cost / best heuristic's, for compute and step;
    the cost network's tau and MAPE on the task's distinct plans."""
    fam, task = fam_task
    key = {n: plan_key(p) for n, p in entry["plans"].items() if p is not None}
    costs = {
        kind: {k: np.array([r[k][kind] for r in entry["rounds"]]) for k in entry["rounds"][0]}
        for kind in ("compute", "step")
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
        out[kind] = {n: float(np.median(c[key[n]] / c[key[best]])) for n in METHODS if n in key}
        out[f"{kind}_best_heuristic"] = best
    plans = distinct_plans(entry)
    if found:
        out["even_spread"] = even_spread(entry) / float(
            np.median(costs["compute"][key[out["compute_best_heuristic"]]])
        )
    measured = [float(np.median(costs["step"][plan_key(p)])) for p in plans]
    predicted = [agent.predict(*plan_target(task, p)).step_ms for p in plans]
    out["cost_tau"] = kendall_tau(predicted, measured)
    out["noise_tau"] = noise_tau(entry)
    out["cost_mape"] = float(
        np.mean(np.abs(np.array(predicted) - measured) / np.array(measured)) * 100
    )
    for tag, cal_agent in (calibrated or {}).items():
        pred = [cal_agent.predict(*plan_target(task, p)).step_ms for p in plans]
        out[f"cost_tau_{tag}"] = kendall_tau(pred, measured)
        out[f"cost_mape_{tag}"] = float(
            np.mean(np.abs(np.array(pred) - measured) / np.array(measured)) * 100
        )
    out["num_plans"] = len(plans)
    out["planning_s"] = entry["secs"]
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


def family_rows(rows: list[dict]) -> dict:
    """Per family: geomeans, worst task and cost-model figures."""
    out = {}
    for fam in dict.fromkeys(r["family"] for r in rows):
        rs = [r for r in rows if r["family"] == fam]
        f = {"tasks": len(rs), "heldout": fam in families.HELDOUT_FAMILIES}
        for kind in ("compute", "step"):
            for n in METHODS:
                vals = [r[kind].get(n) for r in rs]
                f[f"{kind}/{n}"] = geomean(vals)
                f[f"{kind}/{n}/worst"] = max((v for v in vals if v), default=float("nan"))
                f[f"{kind}/{n}/no_plan"] = sum(v is None for v in vals)
            vs_tr = [
                r[kind]["dreamshard"] / r[kind]["torchrec"] for r in rs if "torchrec" in r[kind]
            ]
            f[f"{kind}/dreamshard_vs_torchrec_worst"] = max(vs_tr, default=float("nan"))
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
        out[fam] = f
    return out
