"""Does the verification keep to its budget in wall time, on real kernels?

The tests check what the budget decides on a clock they move themselves
(``tests/test_calibration.py``, ``tests/test_verification.py``): which rounds it keeps,
that nothing is measured past it. How long a verification of real FBGEMM kernels then takes
on this machine, and by how much it passes its budget (the first rounds may stretch it up
to ``BUDGET_STRETCH`` times, and what is not a measurement, such as building the candidate
plans, is not in it), is this script's figure.

For each budget, ``--repeats`` verifications of the tests' tiny task (6 tables on 2
devices, the best 2 candidates, the heuristics' plans, 50 rounds asked for, the noise
checks off), in alternating order of the budgets, each timed by ``time.perf_counter``
around ``verify``: its wall seconds, the seconds it reports, the rounds each plan kept and
the plans it measured. ``--busy-core`` keeps another process spinning on one core
throughout (a user's busy machine).

    .venv/bin/python benchmarks/verify_budget.py
    .venv/bin/python benchmarks/verify_budget.py --budgets 0.5 2 --repeats 5 --busy-core

Writes ``benchmarks/results/<name>.json`` (raw) and ``<name>.md`` (default name
``verify_budget``, ``verify_budget_busy`` with ``--busy-core``).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

from torchrec_dreamshard import calibration as cal
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure import MeasureConfig
from torchrec_dreamshard.policy import DreamShard
from torchrec_dreamshard.verification.verification import BUDGET_STRETCH, MIN_ROUNDS

from harness.busy_core import keep_core_busy
from harness.results_files import load_note, machine, write

FAST = MeasureConfig(rounds=1, iters=2, warmup=1)  # the tests' measurement settings


def tiny_task() -> Task:
    """The tests' tiny task: 6 tables on 2 devices."""
    tables = [
        TableSpec(name=f"t{i}", rows=500 * (i + 1), dim=8 * (1 + i % 2), pooling_factor=1.0 + i)
        for i in range(6)
    ]
    return Task(tables=tables, num_devices=2, memory_bytes=10**7, batch_size=64)


def one_run(agent: DreamShard, task: Task, chosen: list[int], budget: float) -> dict:
    """One verification with ``budget`` seconds, timed around the call."""
    options = cal.VerifyOptions(rounds=50, budget_s=budget, noise=cal.NoiseLimits.off())
    start = time.perf_counter()
    res = cal.verify(agent, task, 2, FAST, options, extra={"chosen": chosen})
    wall = time.perf_counter() - start
    measured = [p for p in res.plans if p.rounds_ms]
    return {
        "budget_s": budget,
        "wall_s": wall,
        "reported_s": res.seconds,
        "over_budget_s": wall - budget,
        "plans": len(res.plans),
        "plans_measured": len(measured),
        "rounds": sorted({len(p.rounds_ms) for p in measured}),
    }


def summary(rows: list[dict], settings: dict, host: dict) -> str:
    lines = [
        "# Verification against its budget, real kernels",
        "",
        f"{settings['repeats']} runs a budget, tiny task (6 tables, 2 devices), 50 rounds asked"
        f" for; the first {MIN_ROUNDS} rounds may stretch the budget {BUDGET_STRETCH:g}x."
        f" Busy core: {settings['busy_core']}. Load average at the start: "
        f"{host['load_average']}. {load_note()}",
        "",
        "| budget s | wall s (median, min-max) | over budget s (max) | rounds kept "
        "| plans measured |",
        "|---|---|---|---|---|",
    ]
    for budget in settings["budgets"]:
        mine = [r for r in rows if r["budget_s"] == budget]
        walls = [r["wall_s"] for r in mine]
        rounds = sorted({n for r in mine for n in r["rounds"]})
        plans = sorted({f"{r['plans_measured']}/{r['plans']}" for r in mine})
        lines.append(
            f"| {budget:g} | {statistics.median(walls):.2f} ({min(walls):.2f}-{max(walls):.2f}) "
            f"| {max(r['over_budget_s'] for r in mine):.2f} | {rounds} | {', '.join(plans)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--busy-core", action="store_true")
    parser.add_argument("--name", default=None)
    args = parser.parse_args()
    name = args.name or ("verify_budget_busy" if args.busy_core else "verify_budget")
    settings = {"budgets": args.budgets, "repeats": args.repeats, "busy_core": args.busy_core}
    host = machine()
    agent, task = DreamShard.untrained(seed=0), tiny_task()
    chosen = agent.place(task)
    rows = []
    with keep_core_busy() if args.busy_core else contextlib.nullcontext():
        cal.verify(agent, task, 2, FAST, cal.VerifyOptions(rounds=1), extra={"chosen": chosen})
        for r in range(args.repeats):
            order = args.budgets if r % 2 == 0 else args.budgets[::-1]
            for budget in order:
                rows.append({"repeat": r, **one_run(agent, task, chosen, budget)})
                print(rows[-1], flush=True)
    raw = {"settings": settings, "machine": host, "rows": rows}
    write(name, raw, summary(rows, settings, host))


if __name__ == "__main__":
    main()
