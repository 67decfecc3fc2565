"""Re-run every benchmark whose figures the README quotes (``make bench``), one after another
so that they never time each other. Each writes its raw results to ``benchmarks/results/``.

    .venv/bin/python benchmarks/run_all.py                 # all of them (about two hours)
    .venv/bin/python benchmarks/run_all.py pool_stats demo # some of them

``training_cost`` reports on a training run (``runs/cpu_default`` unless told otherwise),
and re-trains only with ``--train``: run it by hand.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# In the order they should run: cheap and independent first, the heavy comparisons last.
BENCHMARKS = (
    "pool_stats",
    "collective_ranks",
    "measure_throughput",
    "measure_repeatability",
    "fusion",
    "planning_time",
    "demo",
    "cost_model_accuracy",
    "placement_quality",
    "generalisation",
    "safety_net_study",
    "splits",
    "at_scale",
    "step_time",
    "mixed_headroom",
)
# the arguments the README's figures were taken with, where they are not the defaults
ARGS = {"step_time": ["--rounds", "30"]}


def main(argv: list[str]) -> int:
    names = argv or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmarks {unknown}; choose from {list(BENCHMARKS)}", file=sys.stderr)
        return 2
    failed = []
    for name in names:
        start = time.time()
        print(f"== {name}", flush=True)
        rc = subprocess.call([sys.executable, str(HERE / f"{name}.py"), *ARGS.get(name, [])])
        print(f"== {name}: exit {rc} after {time.time() - start:.0f} s", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
