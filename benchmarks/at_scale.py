"""At scale, every sharding type allowed: DreamShardPlanner against TorchRec's planner.

A 300-table model (the DLRM-shaped pool at full size) on 64 GPUs over 8 hosts of 8
(TorchRec's default bandwidths; planned on meta tensors, so nothing runs on a GPU: the
collectives are priced analytically, unmeasured), per-rank batch 512, TorchRec's
``get_default_sharders()``. For each planner: its planning time, the sharding types it
chose, and its plan's cost under both models:

- **ours**: the typed cost model DreamShard's type choice rates plans with
  (:func:`torchrec_dreamshard.planner.type_choice.typed_step_ms`: the cost network's
  fused kernels per rank, the collectives analytic);
- **TorchRec's**: TorchRec's own analytic estimator (``EmbeddingPerfEstimator``) on every
  shard, rated as its default ``NoopPerfModel`` rates a plan (the slowest rank's total):
  the objective TorchRec's planner searches.

Both plans pass TorchRec's validations (``plan`` runs them). Raw results:
``results/at_scale.json``; report: ``results/at_scale.md``.

Usage: python benchmarks/at_scale.py [--tables 300] [--devices 64] [--local 8] [--cap 300]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from collections import Counter

from torchrec_dreamshard.evaluation.results_files import RESULTS, machine

LOCAL_BATCH = 512
HBM_CAP = 80 * 2**30  # bytes per GPU


def build(tables: int):
    import torch
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from torchrec_dreamshard.data.table_configs import embedding_bag_configs
    from torchrec_dreamshard.data.table_pool import synthetic_pool

    class Model(torch.nn.Module):
        def __init__(self, specs):
            super().__init__()
            self.ebc = EmbeddingBagCollection(
                tables=embedding_bag_configs(specs), device=torch.device("meta")
            )

    specs = synthetic_pool(tables, scale=1.0, seed=0)
    constraints = {t.name: ParameterConstraints(pooling_factors=[t.pooling_factor]) for t in specs}
    return Model(specs), constraints


def torchrec_rating(options, enumerator, topology) -> float:
    """TorchRec's objective for a partitioned plan: its estimator's perf of every shard,
    the slowest rank's total (``NoopPerfModel``)."""
    from torchrec.distributed.planner.perf_models import NoopPerfModel

    from torchrec_dreamshard.planner.enumerators import copy_options

    again = copy_options(options)
    enumerator.populate_estimates(again)
    return float(NoopPerfModel(topology).rate(again))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=300)
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--local", type=int, default=8, help="GPUs per host")
    ap.add_argument("--cap", type=int, default=300, help="TorchRec planner timeout (s)")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    import logging

    import torch
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.types import Topology
    from torchrec.distributed.sharding_plan import get_default_sharders

    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.planner.type_choice import typed_step_ms
    from torchrec_dreamshard.torchrec_compat import best_plan

    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    model, constraints = build(args.tables)

    def topology():
        return Topology(
            world_size=args.devices,
            local_world_size=args.local,
            compute_device="cuda",
            hbm_cap=HBM_CAP,
        )

    ours = DreamShardPlanner(topology(), LOCAL_BATCH, constraints=constraints, debug=False)
    theirs = EmbeddingShardingPlanner(
        topology(), LOCAL_BATCH, constraints=constraints, debug=False, timeout_seconds=args.cap
    )
    rows = {}
    for name, planner in (("dreamshard", ours), ("torchrec", theirs)):
        start = time.perf_counter()
        plan = planner.plan(model, get_default_sharders())
        seconds = time.perf_counter() - start
        rows[name] = {
            "seconds": round(seconds, 2),
            "types": dict(Counter(ps.sharding_type for ps in plan.plan["ebc"].values())),
            "options": best_plan(planner),
        }
        print(name, rows[name]["seconds"], rows[name]["types"], flush=True)
    chooser = ours.proposer.type_chooser
    reference = EmbeddingEnumerator(topology(), LOCAL_BATCH, constraints)
    reference.enumerate(model, get_default_sharders())
    for row in rows.values():
        options = row.pop("options")
        row["ours_ms"] = round(typed_step_ms(options, chooser, ours.table_specs), 3)
        row["torchrec_estimate"] = round(torchrec_rating(options, reference, topology()), 3)
    chosen = ours.proposer.last_types
    out = {
        "machine": machine(),
        "settings": vars(args) | {"local_batch": LOCAL_BATCH, "hbm_cap": HBM_CAP},
        "planners": rows,
        "type_choice": chosen.lines() if chosen else None,
    }
    (RESULTS / "at_scale.json").write_text(json.dumps(out, indent=1))
    (RESULTS / "at_scale.md").write_text(report(out))
    print(report(out))


def report(out: dict) -> str:
    s = out["settings"]
    lines = [
        "# At scale, every sharding type allowed",
        "",
        f"{s['tables']} tables of the DLRM-shaped pool on {s['devices']} GPUs over "
        f"{s['devices'] // s['local']} hosts (meta tensors; collectives priced analytically "
        f"from TorchRec's default bandwidths, unmeasured), per-rank batch {s['local_batch']}, "
        f"`get_default_sharders()`; TorchRec's planner capped at {s['cap']} s.",
        "",
        "| planner | planning s | sharding types | step by our cost model (ms) "
        "| TorchRec's estimate (its objective) |",
        "|---|---:|---|---:|---:|",
    ]
    for name, row in out["planners"].items():
        types = ", ".join(f"{n} {t}" for t, n in sorted(row["types"].items()))
        lines.append(
            f"| {name} | {row['seconds']} | {types} | {row['ours_ms']} | "
            f"{row['torchrec_estimate']} |"
        )
    lines += ["", *(out["type_choice"] or []), "", out["machine"]["note"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
