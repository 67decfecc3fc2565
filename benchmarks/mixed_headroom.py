"""Headroom on a step-time family (``--family``, default mixed): is any plan much faster
than TorchRec's on this machine, and what does our count of replicated tiny tables cost?

The step-time benchmark asks ``DreamShardPlanner`` for 0.90x TorchRec's step on the mixed
family (80 tiny, 2 huge hot and 8 medium tables). Whether that is within reach depends on
the CPU: this script times, on real DMP training steps on 2 gloo ranks in alternating
rounds (:func:`torchrec_dreamshard.evaluation.dmp_step.time_plans`), TorchRec's plan, ours,
and plans that TorchRec's planner makes under forced sharding types, each a way a planner
could spend the step differently:

- ``all_tiny_dp``: every tiny table data-parallel (TorchRec replicates some);
- ``no_dp``: every table table-wise (no all-reduce, every tiny table in the all-to-all);
- ``one_tw`` (tiny only): every table data-parallel but one, table-wise: beside
  ``all_tiny_dp``, what the table-wise path costs a step with a single table on it (the
  input and output distribution TorchRec runs once per sharding type, whatever its tables);
- ``cw_huge``: both huge tables column-wise over both ranks (each rank half of each);
- ``dreamshard_all_tiny_dp``: ``DreamShardPlanner`` with every tiny table held to
  data-parallel, beside ``dreamshard`` (its own count, the fewest tables of its coarse grid
  within the decision's margin: ``planner/type_choice/type_prefixes.py``).

Ratios are to TorchRec's plan, per round, with order-statistic intervals.

    python benchmarks/mixed_headroom.py [--rounds 30] [--family tiny] [--name NAME]

Writes ``results/mixed_headroom.json`` (every round) and ``.md`` (another family:
``results/<family>_headroom.*``).
"""

from __future__ import annotations

import argparse
import dataclasses
import warnings
from collections import Counter

import numpy as np

from torchrec_dreamshard.cli.steptime import NamedPlanner, prepare_machine_models
from torchrec_dreamshard.evaluation.dmp_step import (
    StepTimerConfig,
    make_plan,
    table_shardings,
    time_plans,
)
from torchrec_dreamshard.evaluation.step_stats import median_interval, ratio_interval

from harness.results_files import machine, write
from harness.step_families import WORLD, family_spec

BATCH = 512  # per rank, as the step-time benchmark


@dataclasses.dataclass
class Forced:
    """TorchRec's planner with the sharding types of some tables forced (see the module
    docstring for each ``kind``)."""

    kind: str

    def __call__(self, topology, batch_size, constraints):
        from torchrec.distributed.planner import EmbeddingShardingPlanner

        cons = dict(constraints)
        for name, c in constraints.items():
            if self.kind == "cw_huge" and name.startswith("huge"):
                cons[name] = dataclasses.replace(
                    c, sharding_types=["column_wise"], min_partition=32
                )
            elif self.kind == "all_tiny_dp" and name.startswith("tiny"):
                cons[name] = dataclasses.replace(c, sharding_types=["data_parallel"])
            elif self.kind == "no_dp":
                cons[name] = dataclasses.replace(c, sharding_types=["table_wise"])
            elif self.kind == "one_tw":
                kind = "table_wise" if name == min(constraints) else "data_parallel"
                cons[name] = dataclasses.replace(c, sharding_types=[kind])
        return EmbeddingShardingPlanner(
            topology=topology, batch_size=batch_size, constraints=cons, debug=False
        )


@dataclasses.dataclass
class OursAllTinyDP:
    """``DreamShardPlanner`` (no other flag) with every tiny table held to data-parallel."""

    def __call__(self, topology, batch_size, constraints):
        cons = {
            name: dataclasses.replace(c, sharding_types=["data_parallel"])
            if name.startswith("tiny")
            else c
            for name, c in constraints.items()
        }
        return NamedPlanner("dreamshard")(topology, batch_size, cons)


PLANS = {
    "torchrec": NamedPlanner("torchrec"),
    "dreamshard": NamedPlanner("dreamshard"),
    "dreamshard_all_tiny_dp": OursAllTinyDP(),
    "all_tiny_dp": Forced("all_tiny_dp"),
    "no_dp": Forced("no_dp"),
    "cw_huge": Forced("cw_huge"),
    "one_tw": Forced("one_tw"),
}
# tiny has no huge table; one_tw prices the table-wise path where every other table is tiny
FAMILY_PLANS = {"tiny": [n for n in PLANS if n != "cw_huge"]}
FAMILY_PLANS["mixed"] = [n for n in PLANS if n != "one_tw"]


def summary(times: dict[str, list[float]], types: dict[str, dict], rounds: int, family: str) -> str:
    lines = [
        f"# Headroom on the {family} family: plans timed against TorchRec's",
        "",
        f"Real DMP training steps on {WORLD} gloo ranks, per-rank batch {BATCH}, {rounds} "
        "alternating rounds of 3 warm-up and 10 timed steps; ratios per round to TorchRec's "
        "plan, medians with order-statistic intervals. Produced by "
        f"`python benchmarks/mixed_headroom.py --family {family}`. " + machine()["note"],
        "",
        "| plan | sharding types | median step ms [interval] | / torchrec [interval] |",
        "|---|---|---|---|",
    ]
    for name, ms in times.items():
        step = median_interval(ms)
        kinds = ", ".join(f"{n} {t}" for t, n in sorted(types[name].items()))
        ratio = "1" if name == "torchrec" else _cell(ratio_interval(ms, times["torchrec"]))
        lines.append(f"| {name} | {kinds} | {_cell(step, 2)} | {ratio} |")
    return "\n".join(lines)


def _cell(iv, digits: int = 3) -> str:
    return f"{iv.median:.{digits}f} [{iv.low:.{digits}f}, {iv.high:.{digits}f}]"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--name", help="results name (default: <family>_headroom)")
    ap.add_argument("--family", choices=("mixed", "tiny"), default="mixed")
    args = ap.parse_args(argv)
    prepare_machine_models()
    spec = family_spec(args.family, BATCH)
    names = FAMILY_PLANS[args.family]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plans = {name: make_plan(spec, PLANS[name], WORLD, BATCH) for name in names}
    summaries = {name: table_shardings(plan) for name, plan in plans.items()}
    types = {n: dict(Counter(v["sharding_type"] for v in s.values())) for n, s in summaries.items()}
    times = time_plans(spec, plans, WORLD, StepTimerConfig(rounds=args.rounds, batch_size=BATCH))
    ms = {name: [float(x) for x in times.step_ms(name)] for name in plans}
    raw = {
        "machine": machine(),
        "family": args.family,
        "rounds": args.rounds,
        "plans": summaries,
        "step_ms": ms,
    }
    write(args.name or f"{args.family}_headroom", raw, summary(ms, types, args.rounds, args.family))
    best = min(ms, key=lambda n: float(np.median(ms[n])))
    print(f"fastest median: {best}")


if __name__ == "__main__":
    main()
