"""Plan regression: what the bundled checkpoint plans on the generalisation benchmark's tasks,
so that a refactor can show it changed no plan.

Every task of the generalisation roster (``harness.task_draws.roster``: 3 test tasks
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

``--check`` prints every difference: a mode that now fails or now succeeds, a split that
changed, and a plan whose predicted cost moved by more than ``--rtol``. A plan is compared
up to a relabelling of identical devices (devices of equal memory; the tables on each device
are what is compared, not the device numbers), and another plan whose predicted cost is
within ``--rtol`` of the recorded one is a tie, which another CPU may break the other way
(:mod:`harness.golden_plans`): neither is a difference.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from harness import golden_plans
from harness.golden_plans import TIE_RTOL, placement_partition
from harness.results_files import RESULTS
from harness.task_draws import roster

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
    from torchrec_dreamshard.planner.stages.candidates import default_sources
    from torchrec_dreamshard.policy.checkpoint import load_checkpoint

    agent = load_checkpoint(checkpoint, sources=default_sources())
    tasks = []
    for i, (family, task) in enumerate(roster()):
        entry = {
            "family": family,
            "tables": len(task.tables),
            "devices": task.num_devices,
            "memory": [int(m) for m in task.memory],
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
        memory = b.get("memory") or a.get("memory") or [0] * b["devices"]
        for mode in MODES:
            out += [
                f"{where} {mode}: {d}"
                for d in plan_differences(a["plans"], b["plans"], mode, rtol, memory)
            ]
    return out


def plan_differences(
    old: dict, new: dict, mode: str, rtol: float, memory: list[int] | None = None
) -> list[str]:
    """How one mode's plan changed (empty: it did not, up to a relabelling of devices of
    equal ``memory`` or a tie within ``rtol``)."""
    a, b = old.get(mode), new.get(mode)
    if a is None or b is None:
        return [f"recorded {a is not None}, planned now {b is not None}"]
    if "error" in a or "error" in b:
        return [] if a.get("error") == b.get("error") else [f"{_show(a)} -> {_show(b)}"]
    if a.get("columns", {}) != b.get("columns", {}):
        return [f"split columns {a.get('columns', {})} -> {b.get('columns', {})}"]
    found = golden_plans.plan_differences(
        (placement_partition(a["placement"], memory), a["predicted_ms"]),
        (placement_partition(b["placement"], memory), b["predicted_ms"]),
        rtol,
    )
    return [f"{d}: {_show(b)}" for d in found]


def _show(plan: dict) -> str:
    return plan["error"] if "error" in plan else f"placement {plan['placement']}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the recorded plans")
    ap.add_argument("--path", type=Path, default=PATH, help=f"default: {PATH}")
    ap.add_argument(
        "--rtol",
        type=float,
        default=TIE_RTOL,
        help=f"relative tolerance of a predicted cost, and of a tie (default {TIE_RTOL})",
    )
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
