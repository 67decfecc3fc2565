"""Plan regression: what the bundled checkpoint plans on the generalisation benchmark's tasks,
so that a refactor can show it changed no plan.

Every task of the generalisation roster (``evaluation.task_draws.roster``: 3 test tasks
of every family; task ``i`` planned with seed ``i``) is planned in four modes, planning
only (nothing is measured):

- ``default``: what ``dreamshard plan`` does without options: the safe mode with
  column-wise splits allowed (``plan_with_splits``, mode ``safe``, the CLI's 4 samples);
- ``safe``: the safe mode, whole tables only (``agent.place``);
- ``greedy``: the policy's greedy roll-out;
- ``search``: the search mode.

Each plan is stored as its ``placement`` (a device per table, or per shard when tables are
split, then ``columns`` holds the shard count of each split table), with the cost network's
predicted step ms; a mode that finds no plan stores its ``error``.

Usage:
    python benchmarks/plan_regression.py           # record results/plan_regression.json
    python benchmarks/plan_regression.py --check   # re-plan and compare; exit 1 on a change

``--check`` prints every difference: a plan (placement or split) that changed, a mode that
now fails or now succeeds, and a predicted cost that moved by more than ``--rtol``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from torchrec_dreamshard.evaluation.results_files import RESULTS
from torchrec_dreamshard.evaluation.task_draws import roster

PATH = RESULTS / "plan_regression.json"
MODES = ("default", "safe", "greedy", "search")
CLI_SAMPLES = 4  # `dreamshard plan --num-samples` default


def plan_mode(agent, task, mode: str, seed: int) -> dict:
    """One mode's plan of ``task``: ``placement``, ``columns`` (split tables only) and
    ``predicted_ms``; or ``error`` where the mode finds no plan."""
    from torchrec_dreamshard.policy.protocol import PlaceSettings
    from torchrec_dreamshard.policy.split_search import plan_with_splits

    try:
        if mode == "default":
            found = plan_with_splits(agent, task, PlaceSettings("safe", CLI_SAMPLES, seed))
            return {
                "placement": [int(d) for d in found.placement],
                "columns": dict(found.sharded.counts),
                "predicted_ms": float(found.predicted_ms),
            }
        placement = [int(d) for d in agent.place(task, mode=mode, seed=seed)]
    except ValueError as exc:  # PlacementError and NoPlanError are ValueErrors
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"placement": placement, "predicted_ms": float(agent.predict(task, placement).step_ms)}


def plan_all(checkpoint: str | None = None) -> dict:
    """Every roster task's plans in every mode, with the task's shape."""
    from torchrec_dreamshard.planner.candidates import default_sources
    from torchrec_dreamshard.policy.checkpoint import load_checkpoint

    agent = load_checkpoint(checkpoint, sources=default_sources())
    tasks = []
    for i, (family, task) in enumerate(roster()):
        entry = {
            "family": family,
            "tables": len(task.tables),
            "devices": task.num_devices,
            "plans": {mode: plan_mode(agent, task, mode, seed=i) for mode in MODES},
        }
        tasks.append(entry)
    return {"checkpoint": checkpoint or "bundled", "modes": list(MODES), "tasks": tasks}


def differences(old: dict, new: dict, rtol: float) -> list[str]:
    """Every way ``new`` differs from ``old``, one line each."""
    out = []
    if len(old["tasks"]) != len(new["tasks"]):
        out.append(f"tasks: {len(old['tasks'])} recorded, {len(new['tasks'])} now")
    for i, (a, b) in enumerate(zip(old["tasks"], new["tasks"], strict=False)):
        where = f"task {i} ({b['family']}, T={b['tables']} D={b['devices']})"
        if (a["family"], a["tables"], a["devices"]) != (b["family"], b["tables"], b["devices"]):
            out.append(f"{where}: was {a['family']} T={a['tables']} D={a['devices']}")
            continue
        for mode in MODES:
            out += [
                f"{where} {mode}: {d}" for d in plan_differences(a["plans"], b["plans"], mode, rtol)
            ]
    return out


def plan_differences(old: dict, new: dict, mode: str, rtol: float) -> list[str]:
    """How one mode's plan changed (empty: it did not)."""
    a, b = old.get(mode), new.get(mode)
    if a is None or b is None:
        return [f"recorded {a is not None}, planned now {b is not None}"]
    if "error" in a or "error" in b:
        return [] if a.get("error") == b.get("error") else [f"{_show(a)} -> {_show(b)}"]
    out = []
    if a.get("columns", {}) != b.get("columns", {}):
        out.append(f"split columns {a.get('columns', {})} -> {b.get('columns', {})}")
    if a["placement"] != b["placement"]:
        pairs = zip(a["placement"], b["placement"], strict=False)  # shard counts may differ
        moved = [k for k, (x, y) in enumerate(pairs) if x != y]
        out.append(f"placement changed at {len(moved)} entries (first {moved[:8]}): {_show(b)}")
    if not math.isclose(a["predicted_ms"], b["predicted_ms"], rel_tol=rtol):
        out.append(f"predicted step {a['predicted_ms']:.6f} -> {b['predicted_ms']:.6f} ms")
    return out


def _show(plan: dict) -> str:
    return plan["error"] if "error" in plan else f"placement {plan['placement']}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the recorded plans")
    ap.add_argument("--path", type=Path, default=PATH, help=f"default: {PATH}")
    ap.add_argument("--rtol", type=float, default=1e-6, help="predicted cost tolerance")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    new = plan_all()
    seconds = time.perf_counter() - start
    if not args.check:
        args.path.parent.mkdir(parents=True, exist_ok=True)
        args.path.write_text(json.dumps(new, indent=1) + "\n")
        print(
            f"recorded {len(new['tasks'])} tasks x {len(MODES)} modes in {seconds:.0f} s: "
            f"{args.path}"
        )
        return 0
    if not args.path.exists():
        print(f"{args.path} does not exist: record it first (without --check)", file=sys.stderr)
        return 2
    found = differences(json.loads(args.path.read_text()), new, args.rtol)
    for line in found:
        print(line)
    print(
        f"{len(found)} difference(s) over {len(new['tasks'])} tasks x {len(MODES)} modes "
        f"({seconds:.0f} s)"
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
