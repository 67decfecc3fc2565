"""Repeatability of the sharding-path measurement: the path timed N times in a row as the
profile step times it (:func:`~torchrec_dreamshard.measure.sharding_path.time_sharding_path`
on 2 fresh gloo ranks, 8 interleaved rounds), each timing's median per-round difference
and the standard error the type choice's margin takes from it; also the median with the
first round dropped (is the first round a warm-up?).

The question it answers: does one first plan's path figure stand for the machine, that is,
do repeated timings agree within the error each one claims?

Run: .venv/bin/python benchmarks/path_repeatability.py [--repeats 10] [--name NAME]
"""

from __future__ import annotations

import argparse
import statistics

from torchrec_dreamshard.cost.sharding_path_model import ShardingPathModel
from torchrec_dreamshard.measure.sharding_path import time_sharding_path

from harness.results_files import machine, write


def one_timing(i: int) -> dict:
    """Time the path once; its rounds, median, error and seconds."""
    timings = time_sharding_path()
    model = ShardingPathModel(timings)
    deltas = timings.deltas_ms
    row = {
        "data_parallel_ms": list(timings.data_parallel),
        "one_table_wise_ms": list(timings.one_table_wise),
        "deltas_ms": deltas,
        "median_ms": model.median_ms,
        "error_ms": model.error_ms,
        "median_without_first_ms": statistics.median(deltas[1:]) if len(deltas) > 1 else None,
        "seconds": timings.meta["seconds"],
    }
    print(
        f"{i}: median {row['median_ms']:.2f} ms, error {row['error_ms']:.2f} ms, "
        f"{row['seconds']:.1f} s",
        flush=True,
    )
    return row


def summary(name: str, rows: list[dict], note: str) -> str:
    medians = [r["median_ms"] for r in rows]
    errors = [r["error_ms"] for r in rows]
    spread = statistics.stdev(medians) if len(medians) > 1 else 0.0
    lines = [
        f"# The sharding path timed {len(rows)} times in a row ({name})",
        "",
        note,
        "",
        "| timing | median (ms) | its standard error (ms) | median without round 1 (ms) "
        "| seconds |",
        "|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows):
        first = r["median_without_first_ms"]
        lines.append(
            f"| {i} | {r['median_ms']:.2f} | {r['error_ms']:.2f} "
            f"| {'n/a' if first is None else f'{first:.2f}'} | {r['seconds']:.1f} |"
        )
    lines += [
        "",
        f"Medians {min(medians):.2f}-{max(medians):.2f} ms (mean {statistics.mean(medians):.2f},"
        f" standard deviation {spread:.2f}); each timing's own standard error "
        f"{min(errors):.2f}-{max(errors):.2f} ms (median {statistics.median(errors):.2f}).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--name", default="path_repeatability")
    args = ap.parse_args(argv)
    if args.repeats < 2:
        raise SystemExit(f"--repeats must be at least 2, got {args.repeats}")
    rows = [one_timing(i) for i in range(args.repeats)]
    at_end = machine()
    write(args.name, {"timings": rows, "machine": at_end}, summary(args.name, rows, at_end["note"]))


if __name__ == "__main__":
    main()
