"""Gloo collectives timed with the ranks as threads of one process (what ``plan()`` does:
it starts no process) against ranks that are spawned processes, in interleaved fits.

Run: .venv/bin/python benchmarks/collective_ranks.py [--fits 4] [--name STEM]
"""

from __future__ import annotations

import argparse
import statistics
import time

from torchrec_dreamshard.cost import collective_models as coll
from torchrec_dreamshard.measure import collective_timing as timing
from torchrec_dreamshard.measure.collective_timing import COLLECTIVES
from torchrec_dreamshard.measure.collectives import RANK_KINDS

from harness.results_files import machine, write

KINDS = COLLECTIVES
HEADER = (
    "| collective | ms/MB threads | ms/MB processes | fixed ms threads | fixed ms processes "
    "| RMSE ms threads | RMSE ms processes |\n|---|---|---|---|---|---|---|"
)
HOW = RANK_KINDS  # ("threads", "processes")


def one_fit(how: str) -> dict:
    """One fit of every collective on 2..4 ranks (at most the cores), run ``how``."""
    start = time.perf_counter()
    models = coll.calibrate_collective_models(max_devices=4, backend="gloo", ranks=how)
    fit = {"ranks": how, "seconds": time.perf_counter() - start, "source": models.source}
    for kind in KINDS:
        m = models.models[kind]
        fit[kind] = {
            "latency_ms": m.latency_ms,
            "per_peer_ms": m.per_peer_ms,
            "ms_per_mb": m.ms_per_mb,
            "rmse_ms": m.rmse_ms,
            "ms_2ranks_4mb": models.ms(kind, 2, 4.0),
        }
    print(f"{how}: {fit['seconds']:.1f} s", flush=True)
    return fit


def _cell(fits: list[dict], kind: str, key: str) -> str:
    values = [f[kind][key] for f in fits]
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=4, help="fits of each kind, interleaved")
    parser.add_argument("--name", default="collective_ranks", help="results file stem")
    args = parser.parse_args()
    fits = [one_fit(how) for _ in range(args.fits) for how in HOW]
    by = {how: [f for f in fits if f["ranks"] == how] for how in HOW}
    rows = "\n".join(
        f"| {kind} | {_cell(by['threads'], kind, 'ms_per_mb')} | "
        f"{_cell(by['processes'], kind, 'ms_per_mb')} | "
        f"{_cell(by['threads'], kind, 'latency_ms')} | "
        f"{_cell(by['processes'], kind, 'latency_ms')} | "
        f"{_cell(by['threads'], kind, 'rmse_ms')} | {_cell(by['processes'], kind, 'rmse_ms')} |"
        for kind in KINDS
    )
    seconds = {how: statistics.median(f["seconds"] for f in by[how]) for how in HOW}
    repeats = {"passes": timing.PASSES, "runs_per_pass": timing.REPEATS_PER_PASS}
    out = {"machine": machine(), "repeats": repeats, "fits": fits}
    summary = f"""# Collectives timed on threads or on spawned processes

{args.fits} interleaved fits of each; {timing.PASSES} interleaved passes of
{timing.REPEATS_PER_PASS} timings per buffer size and group, their lower quartile fitted;
medians of the fits, their range in brackets.

{HEADER}
{rows}

One fit: {seconds["threads"]:.1f} s on threads, {seconds["processes"]:.1f} s on processes
(medians). {out["machine"]["note"]}
The RMSE of a fit is the error the type choice's margin takes for that collective.
Raw: {args.name}.json. Script: benchmarks/collective_ranks.py.
"""
    write(args.name, out, summary)


if __name__ == "__main__":
    main()
