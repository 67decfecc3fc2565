"""Safety-net study: which rule for choosing among the safety net's candidates picks, on
real kernels, the fastest plan, family by family.

The safe mode rates about a dozen candidate plans with the cost network, refines the best
three by hill-climbing on the same network, and keeps the lowest rating. On the
generalisation benchmark a refined candidate won 32 of 33 tasks while measurements said
the refinement often made plans slower (it optimises into the model's errors). This study
measures *every* candidate, unrefined and refined (48 steps, the default, and a short 8),
so that selection rules can be compared on the same measurements:

* ``current``: the lowest ``log step + 1.0 std`` over the unrefined and refined plans
  (what ``agent.place`` returns; checked);
* ``no_refine``: the same over the unrefined plans only; ``refine8``: with 8-step
  refinement;
* ``penalty_P``: the uncertainty penalty ``P`` instead of 1.0;
* ``refine_gain_G``: a refined plan replaces its source only where the model rates it at
  least ``G`` lower in log step cost (a trust region on the refinement);
* ``anchor_G``: the model's choice only where it is rated ``G`` below the best-rated
  heuristic candidate (size / dim / lookup / size-lookup / predicted greedy, TorchRec),
  else that heuristic's plan;
* ``policy_greedy``: the policy's greedy roll-out alone; ``policy_no_refine``: the
  lowest-rated of the policy's roll-outs, unrefined (the search mode without refinement);
* ``oracle``: the fastest candidate as measured (what a perfect model would pick).

Tasks are the generalisation families' *test* draws with another seed than
``generalisation.py``'s (default 1 there 0), so that a rule tuned here is judged there on
other tasks. Ratios are to the per-task best of the four proxy heuristics (as placed by
the placers' registry, ``evaluation.placers``), medians over interleaved rounds,
geometric means per family.

Raw results go to ``results/safety_net_study_raw.json`` after every task and every round
(a rerun with the same settings resumes).

Usage: python benchmarks/safety_net_study.py [--per-family 3] [--rounds 3] [--seed 1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from torchrec_dreamshard.data import families
from torchrec_dreamshard.data.tasks import NoPlanError
from torchrec_dreamshard.evaluation.placers import place
from torchrec_dreamshard.measure import MeasureConfig
from torchrec_dreamshard.planner.stages.candidates import default_sources
from torchrec_dreamshard.policy.checkpoint import load_checkpoint
from torchrec_dreamshard.policy.heuristics import HEURISTICS
from torchrec_dreamshard.policy.safety_net import REFINE_STEPS, REFINE_TOP, distinct, refine

from harness.family_statistics import geomean
from harness.plan_measuring import measure_rounds, plan_key
from harness.results_files import RESULTS, load_raw, machine, save_raw, write
from harness.task_draws import roster

SHORT_STEPS = 8
HEURISTIC_SOURCES = (
    "memory_aware_size",
    "memory_aware_dim",
    "memory_aware_lookup",
    "memory_aware_size_lookup",
    "memory_aware_predicted",
    "torchrec_ours",
)
PENALTIES = (0.0, 2.0, 4.0)
GAINS = (0.02, 0.05, 0.10)


def plan_candidates(agent, task, seed: int) -> tuple[dict, dict, str]:
    """Every candidate (unrefined, refined 48 and 8 steps) and the heuristics' plans by
    name; the model's ``[log_step, log_std]`` of each candidate; ``agent.place``'s
    winner."""
    named, _ = agent.candidates(task, seed=seed)
    scorer = agent.scorer(task)
    raw = scorer.candidates(distinct(named))  # as `choose` rates them
    raw.sort(key=lambda c: c.score)
    cands = {c.name: c for c in raw}
    for steps, tag in ((REFINE_STEPS, "r48"), (SHORT_STEPS, "r8")):
        for c in raw[:REFINE_TOP]:
            r = refine(scorer, c, steps, seed)
            cands[f"{c.name}+{tag}"] = r
    plans = {n: [int(d) for d in c.placement] for n, c in cands.items()}
    pred = {n: [c.log_step, c.log_std] for n, c in cands.items()}
    for h in HEURISTICS:
        try:
            plans[f"heuristic:{h}"] = [int(d) for d in place(h, task, seed=seed)]
        except NoPlanError:
            plans[f"heuristic:{h}"] = None
    winner = [int(d) for d in agent.place(task, seed=seed)]
    return plans, pred, plan_key(winner)


def rules() -> dict:
    """Selection rules: ``rule(pred) -> chosen name`` over the candidates' predictions
    ``{name: (log_step, log_std)}`` (refined names end in ``+r48`` / ``+r8``)."""

    def pool(pred, tag):
        return {n: v for n, v in pred.items() if "+" not in n or n.endswith(tag)}

    def lowest(pred, penalty=1.0):
        return min(pred, key=lambda n: pred[n][0] + penalty * pred[n][1])

    def refine_gain(pred, gain):
        keep = {n: v for n, v in pred.items() if "+" not in n}
        for n, v in pred.items():
            if n.endswith("+r48"):
                src = pred[n.split("+")[0]]
                if src[0] + src[1] - (v[0] + v[1]) >= gain:
                    keep[n] = v
        return lowest(keep)

    def anchor(pred, gain):
        choice = lowest(pool(pred, "+r48"))
        heur = {n: v for n, v in pred.items() if n in HEURISTIC_SOURCES}
        if not heur:
            return choice
        h = lowest(heur)
        score = {n: v[0] + v[1] for n, v in pred.items()}
        return choice if score[h] - score[choice] >= gain else h

    out = {
        "current": lambda p: lowest(pool(p, "+r48")),
        "no_refine": lambda p: lowest(pool(p, "+none")),
        "refine8": lambda p: lowest(pool(p, "+r8")),
        "policy_greedy": lambda p: "policy_greedy",
        "policy_no_refine": lambda p: lowest(
            {n: v for n, v in p.items() if n[:7] == "policy_" and "+" not in n}
        ),
    }
    for pen in PENALTIES:
        out[f"penalty_{pen:g}"] = lambda p, pen=pen: lowest(pool(p, "+r48"), pen)
    for g in GAINS:
        out[f"refine_gain_{g:g}"] = lambda p, g=g: refine_gain(p, g)
        out[f"anchor_{g:g}"] = lambda p, g=g: anchor(p, g)
    return out


def task_rows(entry: dict) -> dict:
    """Per cost kind and rule: the chosen plan's median measured cost / best heuristic's."""
    keys = {n: plan_key(p) for n, p in entry["plans"].items() if p is not None}
    out = {"family": entry["family"], "current_matches_place": None}
    for kind in ("compute", "step"):
        med = {
            k: float(np.median([r[k][kind] for r in entry["rounds"]])) for k in entry["rounds"][0]
        }
        best = min(med[keys[f"heuristic:{h}"]] for h in HEURISTICS if f"heuristic:{h}" in keys)
        row = {name: med[keys[rule(entry["pred"])]] / best for name, rule in rules().items()}
        row["oracle"] = min(med[keys[n]] for n in entry["pred"]) / best
        out[kind] = row
    out["current_matches_place"] = keys[rules()["current"](entry["pred"])] == entry["place"]
    return out


def report(rows: list[dict], args, wall: float, note: str) -> tuple[str, dict]:
    names = [*rules(), "oracle"]
    fams = sorted({r["family"] for r in rows}, key=list(families.FAMILIES).index)
    data: dict = {}
    lines = [
        "# Safety-net study: choosing among the candidates, measured",
        "",
        f"{args.per_family} tasks per family (test draws, seed {args.seed}; the generalisation "
        f"benchmark uses seed 0), {args.rounds} interleaved rounds, every candidate measured. "
        "Cells: geometric mean over the family's tasks of the chosen plan's median measured "
        "cost / the per-task best heuristic's. Script: benchmarks/safety_net_study.py.",
        "",
    ]
    for kind in ("compute", "step"):
        lines += [f"## {kind}", "", "| family | " + " | ".join(names) + " |"]
        lines.append("|---" * (len(names) + 1) + "|")
        table = {}
        for fam in [*fams, "all"]:
            sel = [r for r in rows if fam in ("all", r["family"])]
            table[fam] = {n: geomean([r[kind][n] for r in sel]) for n in names}
            cells = " | ".join(f"{table[fam][n]:.3f}" for n in names)
            lines.append(f"| {fam} | {cells} |")
        worst = {n: max(r[kind][n] for r in rows) for n in names}
        over = {n: sum(r[kind][n] > 1.02 for r in rows) for n in names}
        lines.append("| worst task | " + " | ".join(f"{worst[n]:.3f}" for n in names) + " |")
        lines.append("| tasks > 1.02 | " + " | ".join(str(over[n]) for n in names) + " |")
        lines.append("")
        data[kind] = {"families": table, "worst": worst, "over_1.02": over}
    matches = sum(bool(r["current_matches_place"]) for r in rows)
    lines += [
        f"`current` is the plan `agent.place` returned on {matches} of {len(rows)} tasks.",
        "",
        f"Wall time {wall:.0f} s. {note}",
    ]
    return "\n".join(lines) + "\n", data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=None, help="default: the bundled checkpoint")
    ap.add_argument("--per-family", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--families", nargs="*", default=list(families.FAMILIES))
    ap.add_argument("--name", default="safety_net_study", help="results file stem")
    args = ap.parse_args()
    agent = load_checkpoint(args.checkpoint, sources=default_sources())
    config = MeasureConfig()
    tasks = roster(args.families, args.per_family, args.seed)
    settings = {
        "checkpoint": args.checkpoint or "bundled",
        "per_family": args.per_family,
        "families": args.families,
        "seed": args.seed,
    }
    path = RESULTS / f"{args.name}_raw.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw = load_raw(path, settings)
    start, wall_before = time.perf_counter(), raw.get("wall_s", 0.0)
    for i, (fam, task) in enumerate(tasks):
        if i < len(raw["tasks"]):
            continue
        plans, pred, place = plan_candidates(agent, task, args.seed + i)
        entry = {"family": fam, "plans": plans, "pred": pred, "place": place, "rounds": []}
        raw["tasks"].append(entry)
        save_raw(path, raw)
        print(f"planned {fam} T={len(task.tables)} D={task.num_devices}", flush=True)
    measure_rounds(tasks, raw, config, args.rounds, path, start, wall_before)
    rows = [task_rows(e) for e in raw["tasks"]]
    at_end = raw.get("machine", machine())
    text, data = report(rows, args, raw.get("wall_s", 0.0), at_end["note"])
    write(args.name, {"settings": settings, "tasks": rows, **data, "machine": at_end}, text)


if __name__ == "__main__":
    main()
