"""Memory the job really uses: TorchRec's storage estimate against what each rank holds,
before and after learning, and the check before the job.

On 2 gloo ranks spawned on this machine (one thread each), a DLRM whose fused optimizer
is given the way TorchRec's DLRM example gives it (the sharder's ``fused_params``:
``EXACT_ADAGRAD``), which TorchRec's storage estimate does not count (it reads the
optimizer off the tables' parameters, where ``_apply_optimizer_in_backward`` puts it):

1. ``DreamShardPlanner.collective_plan`` plans it with a cap of 40 MB a rank (the
   bundled checkpoint, no calibration: memory is the question); the job trains
   ``--steps`` steps observed;
   ``observer.report()`` sets each rank's and table's estimate beside its measured bytes
   (weights, optimizer state, per-step buffers); ``observer.replan()`` learns the storage
   correction;
2. a fresh planner of the same arguments with ``storage_correction=`` the learnt one (a
   later plan on the same hardware) plans again; that job is observed the same way: its
   report is the prediction made before it ran against what it measured;
3. the check before the job (``feedback.memory_check.check_plan``) of both plans, against
   what their jobs measured.

    .venv/bin/python benchmarks/memory.py              # writes results/memory.json, .md

Writes ``benchmarks/results/<name>.json`` (raw) and ``<name>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from torchrec_dreamshard.measure.hardware import cpu_name

from harness.dlrm_jobs import dlrm_train, poisson_batch, table_configs
from harness.results_files import RESULTS

WORLD = 2
BATCH = 256  # per rank
CAP = 40_000_000  # bytes a rank: the first plan fits it by TorchRec's estimate, not in the job
DIM = 16
TABLES = [  # (rows, ids per sample): weight-heavy tables and small, heavily pooled ones
    (200_000, 1.0),
    (100_000, 2.0),
    (50_000, 1.0),
    (20_000, 4.0),
    (500, 40.0),
    (1_000, 30.0),
    (200, 60.0),
    (2_000, 20.0),
]
EBC = "model.sparse_arch.embedding_bag_collection"


def build_model():
    """TorchRec's DLRM (in its training wrapper) over :data:`TABLES` on the meta device."""
    return dlrm_train(table_configs(TABLES, DIM))


def make_batch(rank: int, step: int):
    return poisson_batch(TABLES, BATCH, rank, step)


def _job(rank: int, planner, plan, sharders, steps: int):
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from torchrec_dreamshard import observe

    dmp = DistributedModelParallel(
        build_model(), device=torch.device("cpu"), plan=plan, sharders=sharders
    )
    dense = [p for n, p in dmp.named_parameters() if "embedding_bag" not in n]
    opt = torch.optim.SGD(dense, lr=0.05)
    observer = observe(planner, dmp, every=5, warmup=5, max_overhead=None)
    for step in range(steps):
        loss, _ = dmp(make_batch(rank, step))
        opt.zero_grad()
        loss.backward()
        opt.step()
        observer.step()
    return observer


def rank_job(rank: int, world: int, port: int, out: str, steps: int) -> None:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import ParameterConstraints, Storage

    from torchrec_dreamshard.feedback.memory_check import check_plan
    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.planner.adapters.torchrec_adapter import torchrec_topology
    from torchrec_dreamshard.ranks.spawn import exit_spawned_rank, local_process_group

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    fused = {"optimizer": EmbOptimType.EXACT_ADAGRAD, "learning_rate": 0.05}
    sharders = [EmbeddingBagCollectionSharder(fused_params=fused)]
    constraints = {
        f"t{i}": ParameterConstraints(pooling_factors=[p]) for i, (_, p) in enumerate(TABLES)
    }
    pooling = {f"{EBC}.t{i}": p for i, (_, p) in enumerate(TABLES)}

    def planner(correction=None):
        topology = torchrec_topology(world, "cpu")
        for device in topology.devices:
            device.storage = Storage(hbm=0, ddr=CAP)
        return DreamShardPlanner(
            topology=topology,
            batch_size=BATCH,
            constraints=constraints,
            calibrate=False,
            storage_correction=correction,
        )

    result = {}
    with local_process_group(rank, world, port):
        first = planner()
        plan = first.collective_plan(build_model(), sharders, dist.GroupMember.WORLD)
        observer = _job(rank, first, plan, sharders, steps)
        result["before"] = observer.report()
        observer.replan()
        result["learnt"] = observer.report()
        learnt = observer.storage_correction()
        second = planner(learnt)
        plan2 = second.collective_plan(build_model(), sharders, dist.GroupMember.WORLD)
        result["later"] = _job(rank, second, plan2, sharders, steps).report()
        if rank == 0:
            result["check"] = [
                check_plan(p, build_model(), BATCH, world, fused, pooling) for p in (plan, plan2)
            ]
        result["plans"] = [str(plan), str(plan2)]
        Path(out, f"rank{rank}.json").write_text(json.dumps(result, default=str))
    exit_spawned_rank()


def summary(rank0: dict) -> dict:
    """The figures: per rank, TorchRec's error and the parts off; after learning (the
    observed plan, and the later plan's job, predicted before it ran); the checks."""
    out: dict = {}
    for key in ("before", "later"):
        memory = rank0[key]["memory"]
        out[key] = [
            {
                "rank": r["rank"],
                "predicted_mb": r["predicted"] / 2**20,
                "measured_mb": r["measured"] / 2**20,
                "error": r["error"],
                "off": r["off"],
                "peak_mb": r["peak"] / 2**20,
            }
            for r in memory["ranks"]
        ]
    out["learnt_on_observed_plan"] = rank0["learnt"]["memory"]["after_learning"]["ranks"]
    out["correction"] = rank0["learnt"]["memory"]["after_learning"]["correction"]
    out["near_cap"] = [rank0[k]["memory"]["near_cap"] for k in ("before", "later")]
    out["changed"] = rank0["plans"][0] != rank0["plans"][1]
    out["check"] = []
    for key, check in zip(("before", "later"), rank0["check"], strict=True):
        measured = [r["measured"] for r in rank0[key]["memory"]["ranks"]]
        out["check"].append([c["total"] / m - 1 for c, m in zip(check, measured, strict=True) if m])
    return out


def markdown(result: dict) -> str:
    s = result["summary"]
    lines = [
        "# Memory the job really uses (`benchmarks/memory.py`)",
        "",
        f"{result['machine']}, {WORLD} gloo ranks (the machine shared with other jobs), "
        f"cap {CAP / 1e6:.0f} MB ({CAP / 2**20:.2f} MiB) a rank, per-rank batch {BATCH}, "
        f"{len(TABLES)} tables (dim {DIM}), fused EXACT_ADAGRAD "
        "given as the sharder's fused_params (TorchRec's DLRM example), "
        f"{result['steps']} observed steps a job. Error: measured / predicted - 1 of the "
        "tables' bytes on the rank (weights + optimizer state + per-step buffers).",
        "",
        "| plan | rank | predicted MiB | measured MiB | error | off | peak MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {"before": "first (TorchRec's estimate)", "later": "later plan (corrected)"}
    for key in ("before", "later"):
        for r in s[key]:
            lines.append(
                f"| {names[key]} | {r['rank']} | {r['predicted_mb']:.2f} | "
                f"{r['measured_mb']:.2f} | {r['error']:+.1%} | {', '.join(r['off']) or '-'} | "
                f"{r['peak_mb']:.2f} |"
            )
    learnt = ", ".join(f"rank {r['rank']} {r['error']:+.1%}" for r in s["learnt_on_observed_plan"])
    checks = "; ".join(", ".join(f"{e:+.1%}" for e in c) for c in s["check"])
    lines += [
        "",
        f"After learning, the first plan predicted with the correction: {learnt}.",
        f"Check before the job against the job's measured bytes, per rank (first; later): "
        f"{checks}.",
        f"Correction (kernel factors): {s['correction']['kernels']}. Ranks warned of "
        f"(peak within 10% of the cap): first {s['near_cap'][0]}, later {s['near_cap'][1]}; "
        f"the plans {'differ' if s['changed'] else 'are the same'}.",
        "",
        f"Wall time {result['wall_s']:.0f} s. Raw: `{result['name']}.json`.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    from torchrec_dreamshard.ranks.spawn import free_port

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=22)
    parser.add_argument("--name", default="memory")
    args = parser.parse_args()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(rank_job, args=(WORLD, free_port(), out, args.steps), nprocs=WORLD, join=True)
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORLD)]
    result = {
        "name": args.name,
        "machine": f"{cpu_name()}, {os.cpu_count()} cores",
        "steps": args.steps,
        "tables": TABLES,
        "batch": BATCH,
        "raw": ranks[0],
        "wall_s": time.perf_counter() - start,
    }
    result["summary"] = summary(ranks[0])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=1, default=str))
    (RESULTS / f"{args.name}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
