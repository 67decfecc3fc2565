"""Fusion on this hardware: a random shard's fused cost against the sum of its tables'
single-table costs, for row-wise Adagrad and SGD.

Run: .venv/bin/python benchmarks/fusion.py
"""

from __future__ import annotations

import numpy as np

from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool
from torchrec_dreamshard.measure import MeasureConfig, time_fused_kernel

from harness.results_files import machine, write

SHARDS = 12
BATCH = 2048


def ratios(optimizer: str, shards: list) -> dict:
    config = MeasureConfig(optimizer=optimizer)
    fwd_r, bwd_r = [], []
    for i, shard in enumerate(shards):
        fused = time_fused_kernel(shard, BATCH, config)
        singles = np.array([time_fused_kernel([t], BATCH, config) for t in shard]).sum(axis=0)
        fwd_r.append(fused[0] / singles[0])
        bwd_r.append(fused[1] / singles[1])
        print(
            f"{optimizer} shard {i} ({len(shard)} tables): fwd {fwd_r[-1]:.2f} bwd {bwd_r[-1]:.2f}",
            flush=True,
        )
    q = [10, 50, 90]
    return {
        "fwd_ratio": fwd_r,
        "bwd_ratio": bwd_r,
        "fwd_percentiles_10_50_90": np.percentile(fwd_r, q).tolist(),
        "bwd_percentiles_10_50_90": np.percentile(bwd_r, q).tolist(),
    }


def main() -> None:
    pool = synthetic_pool(scale=CPU_POOL_SCALE, seed=0)
    rng = np.random.default_rng(0)
    shards = [
        [pool[i] for i in rng.choice(len(pool), int(rng.integers(2, 11)), replace=False)]
        for _ in range(SHARDS)
    ]
    out = {
        "machine": machine(),
        "batch_size": BATCH,
        "shard_sizes": [len(s) for s in shards],
        "optimizers": {},
    }
    for opt in ("rowwise_adagrad", "sgd"):
        out["optimizers"][opt] = ratios(opt, shards)
    rows = "\n".join(
        f"| {o} | "
        + " / ".join(f"{x:.2f}" for x in r["fwd_percentiles_10_50_90"])
        + " | "
        + " / ".join(f"{x:.2f}" for x in r["bwd_percentiles_10_50_90"])
        + " |"
        for o, r in out["optimizers"].items()
    )
    summary = f"""# Fusion on this hardware

{SHARDS} random shards of 2-10 DLRM-shaped tables (CPU scale), batch {BATCH}, one CPU thread.
Ratio = fused kernel time / sum of the tables' single-table kernel times (each the minimum
over rounds of the median of timed iterations, fresh batches, written memory).

| optimizer | forward ratio p10 / p50 / p90 | backward ratio p10 / p50 / p90 |
|---|---|---|
{rows}

{out["machine"]["note"]}
Raw: fusion.json. Script: benchmarks/fusion.py.
"""
    write("fusion", out, summary)


if __name__ == "__main__":
    main()
