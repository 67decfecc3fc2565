"""Compare the synthetic table pool with the statistics published for Meta's open DLRM
embedding dataset (856 tables, batch 65536).

Two views of the pool:
* "spec": the pool's own reuse histograms (what the planner's features see);
* "generated": ids actually drawn by the workload generator for a sample of the tables
  at the dataset's batch size, then measured with ``access_stats`` (what the kernels see).

Writes benchmarks/results/pool_stats.json (raw) and pool_stats.md (the README table).

    .venv/bin/python benchmarks/pool_stats.py [--every 8] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from torchrec_dreamshard.data.table_pool import (
    DLRM_BATCH_SIZE,
    DLRM_PUBLISHED_ACCESS_SHARE,
    DLRM_PUBLISHED_ROWS_ACCESSED_ONCE,
    pool_access_share,
    pool_rows_accessed_once,
    synthetic_pool,
    to_published_bins,
)
from torchrec_dreamshard.data.tables import TableSpec, reuse_bin
from torchrec_dreamshard.data.workloads import generate_batch

from harness.results_files import RESULTS

BIN_LABELS = ["(0,1]"] + [f"({2 ** (k - 1)},{2**k}]" for k in range(1, 15)] + ["beyond 16384"]


def generated_stats(tables: list[TableSpec], batch: int) -> tuple[np.ndarray, float]:
    """Share of accesses by reuse bin, and the fraction of accessed rows read once, counted
    from ids drawn by the workload generator."""
    acc = np.zeros(17)
    once = rows_total = 0
    for i, t in enumerate(tables):
        ids, _ = generate_batch(t, batch, seed=i)
        _, counts = np.unique(ids.numpy(), return_counts=True)
        acc += np.bincount(reuse_bin(counts), weights=counts, minlength=17)
        once += int(np.sum(counts == 1))
        rows_total += counts.size
    return acc / acc.sum(), once / rows_total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=1, help="generate ids for every Nth table")
    parser.add_argument("--scale", type=float, default=1.0, help="pool row scale")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    start = time.time()
    pool = synthetic_pool(scale=args.scale, seed=args.seed)
    published = np.asarray(DLRM_PUBLISHED_ACCESS_SHARE, dtype=np.float64)
    spec_share = to_published_bins(pool_access_share(pool, DLRM_BATCH_SIZE))
    spec_once = pool_rows_accessed_once(pool, DLRM_BATCH_SIZE)
    sample = pool[:: args.every]
    gen_share17, gen_once = generated_stats(sample, DLRM_BATCH_SIZE)
    gen_share = to_published_bins(gen_share17)
    result = {
        "pool": {"tables": len(pool), "scale": args.scale, "seed": args.seed},
        "batch_size": DLRM_BATCH_SIZE,
        "generated_tables": len(sample),
        "bins": BIN_LABELS,
        "published_access_share": published.round(4).tolist(),
        "spec_access_share": spec_share.round(4).tolist(),
        "generated_access_share": gen_share.round(4).tolist(),
        "published_rows_accessed_once": DLRM_PUBLISHED_ROWS_ACCESSED_ONCE,
        "spec_rows_accessed_once": round(spec_once, 4),
        "generated_rows_accessed_once": round(gen_once, 4),
        "max_abs_diff_spec": round(float(np.abs(spec_share - published).max()), 4),
        "max_abs_diff_generated": round(float(np.abs(gen_share - published).max()), 4),
        "rows": {"min": min(t.rows for t in pool), "max": max(t.rows for t in pool)},
        "dims": sorted({t.dim for t in pool}),
        "pooling": {
            "min": min(t.pooling_factor for t in pool),
            "median": float(np.median([t.pooling_factor for t in pool])),
            "max": max(t.pooling_factor for t in pool),
        },
        "seconds": round(time.time() - start, 1),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "pool_stats.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / "pool_stats.md").write_text(markdown(result))
    print(markdown(result))


def markdown(r: dict) -> str:
    lines = [
        f"Synthetic pool ({r['pool']['tables']} tables, scale {r['pool']['scale']}) against "
        f"Meta's open DLRM dataset, batch {r['batch_size']}; generated ids for "
        f"{r['generated_tables']} tables.",
        "",
        "| share of index accesses | published | pool (specs) | pool (generated ids) |",
        "|---|---|---|---|",
    ]
    for label, p, s, g in zip(
        r["bins"],
        r["published_access_share"],
        r["spec_access_share"],
        r["generated_access_share"],
        strict=True,
    ):
        lines.append(f"| {label} | {p:.3f} | {s:.3f} | {g:.3f} |")
    lines.append(
        f"| accessed rows read once | {r['published_rows_accessed_once']:.2f} | "
        f"{r['spec_rows_accessed_once']:.2f} | {r['generated_rows_accessed_once']:.2f} |"
    )
    lines += [
        "",
        f"Largest gap in a bin: {r['max_abs_diff_spec']:.3f} (specs), "
        f"{r['max_abs_diff_generated']:.3f} (generated ids). Rows {r['rows']['min']} to "
        f"{r['rows']['max']}, dims {r['dims']}, pooling factors {r['pooling']['min']} to "
        f"{r['pooling']['max']} (median {r['pooling']['median']:.1f}).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
