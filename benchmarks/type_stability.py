"""Does the default planner give the same sharding types when the same model is planned on
the same machine from an empty cache, again and again? And where a type decision was
close, do the stats say which measurement tipped it and by how much?

Each run is a fresh process with its own empty ``XDG_CACHE_HOME`` (and so its own
calibration store), planning a step-time family's model (``benchmarks/harness/step_families.py``)
with ``DreamShardPlanner`` and TorchRec's default sharders on a 2-rank CPU topology, every
sharding type its constraints allow, no flags: it measures the collectives, the dense and
reference kernels, calibrates and verifies where the checkpoint misprices this machine,
exactly as a user's first plan would. Recorded per run: each table's sharding type, the
type choice's decisions (gain, margin, uncertainty, what tipped it) and the seconds.

Raw results: ``results/type_stability.json`` (``--name``: another stem; one entry per run,
written after each).

Usage: python benchmarks/type_stability.py [--families mixed tiny] [--runs 3] [--name NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter

from harness.results_files import RESULTS, machine

ONE_RUN = """
import json, sys, time
import torch
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec_dreamshard import DreamShardPlanner
from harness.step_families import family_spec
from torchrec_dreamshard.evaluation.step_model import StepDLRM
from torchrec_dreamshard.planner.adapters.topology import torchrec_topology

spec = family_spec(sys.argv[1], 512)
planner = DreamShardPlanner(
    topology=torchrec_topology(2, "cpu"), batch_size=512, constraints=spec.planner_constraints()
)
start = time.perf_counter()
plan = planner.plan(StepDLRM(spec, torch.device("meta")), get_default_sharders())
seconds = time.perf_counter() - start
types = {f"{m}.{t}": p.sharding_type for m, mp in plan.plan.items() for t, p in mp.items()}
adaptation = planner.adaptation
print(json.dumps({"types": types, "seconds": seconds,
                  "type_choice": adaptation.get("types"), "spent_s": adaptation.get("spent_s"),
                  "calibrated": adaptation.get("calibrated")}))
"""


def one_run(family: str) -> dict:
    """Plan ``family``'s model in a fresh process on an empty cache; what it decided."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "XDG_CACHE_HOME": cache}
        env.pop("DREAMSHARD_CALIBRATION_STORE", None)
        out = subprocess.run(
            [sys.executable, "-c", ONE_RUN, family],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="*", default=["mixed", "tiny"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--name", default="type_stability", help="results file stem")
    args = ap.parse_args(argv)
    path = RESULTS / f"{args.name}.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    for family in args.families:
        for run in range(args.runs):
            r = one_run(family)
            results.append({"family": family, "run": run, **r})
            path.write_text(json.dumps({"machine": machine(), "runs": results}, indent=1))
            counts = Counter(r["types"].values())
            print(f"{family} run {run}: {dict(counts)} in {r['seconds']:.1f} s", flush=True)
    for family in args.families:
        runs = [r["types"] for r in results if r["family"] == family]
        same = all(t == runs[0] for t in runs)
        print(f"{family}: the same types in all {len(runs)} runs: {same}")


if __name__ == "__main__":
    main()
