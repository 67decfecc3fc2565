"""The production-shaped model ``benchmarks/at_scale.py`` plans, and plans as plain JSON.

An ``EmbeddingBagCollection`` on the meta device: tables of 1e3 to 5e7 rows (log-uniform),
dims 16 to 256 (powers of two, uniform), pooling factor 1; one feature per table. Planned
on a CUDA topology of 80 GB devices, ``local`` per host, per-rank batch 8192, with
``get_default_sharders()`` and no constraints, so every sharding type is allowed.

Also the TorchRec side of the benchmark, run as a subprocess so that it can be stopped:
``python benchmarks/at_scale_model.py torchrec TABLES DEVICES LOCAL OUT.json``.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from collections import Counter

import numpy as np

LOCAL_BATCH = 8192
HBM_CAP = 80 * 2**30  # bytes per GPU
DIMS = (16, 32, 64, 128, 256)
ROWS = (1e3, 5e7)


def table_shapes(tables: int, seed: int = 0) -> list[tuple[str, int, int]]:
    """``(name, rows, dim)`` of every table (see the module docstring)."""
    rng = np.random.default_rng(seed)
    rows = np.exp(rng.uniform(np.log(ROWS[0]), np.log(ROWS[1]), tables)).astype(int)
    dims = rng.choice(DIMS, tables)
    return [(f"t{i}", int(r), int(d)) for i, (r, d) in enumerate(zip(rows, dims, strict=True))]


def build(tables: int, seed: int = 0):
    """The model (its ``ebc`` holds the tables), on the meta device."""
    import torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    configs = [
        EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=r, feature_names=[f"f_{n}"])
        for n, r, d in table_shapes(tables, seed)
    ]

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))

    return Model()


def topology(devices: int, local: int):
    """TorchRec's CUDA topology of ``devices`` 80 GB GPUs, ``local`` per host."""
    from torchrec.distributed.planner.types import Topology

    return Topology(
        world_size=devices, local_world_size=local, compute_device="cuda", hbm_cap=HBM_CAP
    )


def plan_entries(plan) -> dict[str, dict]:
    """A ``ShardingPlan``'s ``ebc`` as plain JSON: per table its type, kernel, ranks and
    shards ``[row offset, col offset, rows, cols, rank]`` (data-parallel: no shards)."""
    out = {}
    for name, ps in plan.plan["ebc"].items():
        shards = []
        if ps.sharding_spec is not None:
            for s in ps.sharding_spec.shards:
                shards.append([*s.shard_offsets, *s.shard_sizes, s.placement.rank()])
        out[name] = {
            "type": ps.sharding_type,
            "kernel": ps.compute_kernel,
            "ranks": list(ps.ranks or []),
            "shards": shards,
        }
    return out


def plan_with_torchrec(tables: int, devices: int, local: int, cap_s: int) -> dict:
    """TorchRec's ``EmbeddingShardingPlanner`` on the model: its time, types and plan."""
    import logging

    import torch
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.sharding_plan import get_default_sharders

    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    model = build(tables)
    planner = EmbeddingShardingPlanner(
        topology(devices, local), LOCAL_BATCH, debug=False, timeout_seconds=cap_s
    )
    start = time.perf_counter()
    plan = planner.plan(model, get_default_sharders())
    seconds = time.perf_counter() - start
    entries = plan_entries(plan)
    types = Counter(e["type"] for e in entries.values())
    return {"seconds": seconds, "types": dict(types), "plan": entries}


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    _, what, t, d, loc, out = sys.argv[:6]
    if what != "torchrec":
        raise SystemExit(f"unknown command {what!r}; expected 'torchrec'")
    # TorchRec checks its timeout between proposals only; the caller kills at its cap
    result = plan_with_torchrec(int(t), int(d), int(loc), cap_s=int(sys.argv[6]))
    with open(out, "w") as f:
        json.dump(result, f)
