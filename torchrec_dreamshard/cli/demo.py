"""``dreamshard demo``: DreamShardPlanner against TorchRec's default planner on a DLRM of
synthetic tables the checkpoint never saw: both plans measured on FBGEMM's kernels, then
a few training steps under ``DistributedModelParallel`` on gloo ranks."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from torchrec_dreamshard.cli._batch_args import add_global_batch_arg

EXAMPLES = """examples:
  dreamshard demo
  dreamshard demo --out benchmarks/results/demo.json
  dreamshard demo --tables 40 --devices 4 --train-ranks 2 --checkpoint my_gpus.pt
  dreamshard demo --no-calibrate      # the checkpoint as it is (no fine-tuning)
"""

TRAIN_LOCAL_BATCH = 256
LR = 0.01


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="plan a DLRM with DreamShard and TorchRec, measure both, train a few steps",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tables", type=int, default=60, help="tables in the model")
    p.add_argument("--devices", type=int, default=4, help="devices the plans are for")
    add_global_batch_arg(p, 2048)
    p.add_argument("--checkpoint", metavar="PATH", help="agent checkpoint (default: bundled)")
    p.add_argument("--mode", choices=["safe", "greedy", "search"], default="safe")
    p.add_argument("--train-ranks", type=int, default=2, help="gloo ranks for training")
    p.add_argument("--train-steps", type=int, default=3)
    p.add_argument(
        "--calibrate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="calibrate on this machine always (--calibrate, 60 s) or never "
        "(--no-calibrate: no fine-tuning, though the planner still times this machine's "
        "reference kernel); default: where the checkpoint misprices its reference kernel. "
        "The demo then measures both plans on real kernels whatever this says",
    )
    p.add_argument("--out", metavar="DEMO.json", help="write the side-by-side as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torchrec_dreamshard.io import atomic_write, check_writable, dumps_strict

    warnings.filterwarnings("ignore")
    if args.out:  # before the work, so a bad path never costs it
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        check_writable(args.out, "--out file")
    task = demo_task(args.seed, args.tables, args.devices, args.global_batch_size)
    print(
        f"model: {len(task.tables)} DLRM-shaped tables ({task.total_bytes / 2**20:.0f} MiB), "
        f"{task.num_devices} devices, global batch {task.batch_size}"
    )
    result: dict[str, Any] = {"task": task.to_dict()}
    ours, theirs, mtask, profile = plan_both(task, args)
    result["planners"] = {"dreamshard": ours, "torchrec": theirs}
    measure_both(mtask, ours, theirs)
    print(format_side_by_side(ours, theirs))
    result["measure_task"] = {"memory_bytes": mtask.memory, "batch_size": mtask.batch_size}
    with tempfile.TemporaryDirectory() as tmp:
        path = None
        if profile is not None:  # the job plans from what the first plan measured
            path = str(Path(tmp) / "machine.profile")
            profile.save(path)
        result["training"] = train_demo(task, args, path)
    if args.out:
        atomic_write(args.out, dumps_strict(result), "--out file")
        print(f"wrote {args.out}")
    return 0


def demo_task(seed: int, num_tables: int, num_devices: int, batch_size: int):
    """Tables from the synthetic pool's test split (CPU scale)."""
    from torchrec_dreamshard.data.sampler import TaskSampler
    from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool

    pool = synthetic_pool(scale=CPU_POOL_SCALE, seed=seed)
    return TaskSampler(pool, seed=seed).sample("test", num_tables, num_devices, batch_size)


def plan_both(task, args: argparse.Namespace) -> tuple[dict, dict, Any, Any]:
    """Both planners' summaries, the task to measure on and our planner's machine profile."""
    import torch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    from torchrec_dreamshard.data.task_fields import per_rank_batch
    from torchrec_dreamshard.data.tasks import Task
    from torchrec_dreamshard.evaluation.step_model import StepDLRM, StepModelSpec, sample_kjt
    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.planner.adapters.torchrec_adapter import (
        heuristical_reservation,
        planner_reserved_topology,
        table_wise_constraints,
        torchrec_topology,
    )

    local_batch = per_rank_batch(task.batch_size, task.num_devices)
    # the task's memory plus room for TorchRec's reservation, optimizer state and buffers
    topology = torchrec_topology(task.num_devices, "cpu", ddr_cap=int(task.memory[0] * 1.5))
    model = StepDLRM(StepModelSpec(bags=task.tables), torch.device("meta"))
    sharders = [EmbeddingBagCollectionSharder()]
    samples = [sample_kjt(task.tables, local_batch, s) for s in range(task.num_devices)]
    ours_planner = DreamShardPlanner(
        topology=topology,
        batch_size=local_batch,
        constraints=table_wise_constraints(task.tables),
        storage_reservation=heuristical_reservation(model, sharders),
        checkpoint=args.checkpoint,
        mode=args.mode,
        seed=args.seed,
        sample_batches=samples,
        debug=False,
        calibrate=args.calibrate,
    )
    print("\n== DreamShardPlanner (TorchRec's plan stats, then the cost network's) ==")
    with planner_logs():
        ours = timed_placement(ours_planner, model, sharders, task)
    ours["adaptation"] = ours_planner.adaptation
    print("\n".join(adaptation_lines(ours["adaptation"])))
    theirs_planner = EmbeddingShardingPlanner(
        topology=topology,
        batch_size=local_batch,
        constraints=table_wise_constraints(task.tables),
        storage_reservation=heuristical_reservation(model, sharders),
    )
    theirs = timed_placement(theirs_planner, model, sharders, task)
    reserved = planner_reserved_topology(ours_planner)
    memory = [int(d.storage.ddr) for d in reserved.devices]
    mtask = Task(
        tables=task.tables,
        num_devices=task.num_devices,
        memory_bytes=memory,
        batch_size=task.batch_size,
    )
    agent = ours_planner.agent
    prior = agent.prior
    for summary in (ours, theirs):
        summary["predicted_step_ms"] = agent.predict(mtask, summary["placement"]).step_ms
        summary["checkpoint_step_ms"] = prior.predict(mtask, summary["placement"]).step_ms
    return ours, theirs, mtask, ours_planner.profile


def adaptation_lines(adaptation: dict[str, Any]) -> list[str]:
    """What the planner measured on this machine, whether it calibrated and verified."""
    from torchrec_dreamshard.calibration.adaptation_report import adaptation_lines as lines

    return ["", "== adapting to this machine ==", *lines(adaptation)]


def timed_placement(planner, model, sharders, task) -> dict[str, Any]:
    """``planner``'s plan of ``model``: ``placement`` (each table's rank) and ``planning_s``."""
    from torchrec_dreamshard.evaluation.dmp_step import table_shardings

    start = time.perf_counter()
    plan = planner.plan(model, sharders)
    seconds = time.perf_counter() - start
    tables = table_shardings(plan)
    placement = [int(tables[t.name]["ranks"][0]) for t in task.tables]
    return {"planning_s": seconds, "placement": placement}


class planner_logs:
    """Show the planner's INFO logs (TorchRec's stats and ours) on stdout while open."""

    NAMES = ("torchrec.distributed.planner.stats", "torchrec_dreamshard.planner.stages.stats")

    def __enter__(self) -> None:
        self.handler = logging.StreamHandler(sys.stdout)
        self.handler.setFormatter(logging.Formatter("%(message)s"))
        self.saved = []
        for name in self.NAMES:
            log = logging.getLogger(name)
            self.saved.append((log, log.level, log.propagate))
            log.setLevel(logging.INFO)
            log.propagate = False
            log.addHandler(self.handler)

    def __exit__(self, *exc: object) -> None:
        for log, level, propagate in self.saved:
            log.removeHandler(self.handler)
            log.setLevel(level)
            log.propagate = propagate


def measure_both(mtask, ours: dict, theirs: dict) -> None:
    """Measure both placements on real kernels (adds ``measured`` to each summary)."""
    from torchrec_dreamshard.cost.collective_models import local_all_to_all
    from torchrec_dreamshard.measure import measure_placement

    comm = local_all_to_all(mtask.num_devices)
    for name, summary in (("DreamShard", ours), ("TorchRec", theirs)):
        print(f"measuring the {name} plan on real FBGEMM kernels...", flush=True)
        m = measure_placement(mtask, summary["placement"], comm=comm)
        if not m.ok:
            raise RuntimeError(f"measuring the {name} plan failed: {m.error}")
        summary["measured"] = m.to_dict()


def format_side_by_side(ours: dict, theirs: dict) -> str:
    """Per-device measured times of both plans, then the step costs and planning times."""
    from torchrec_dreamshard.device_report import device_table

    a, b = ours["measured"], theirs["measured"]
    left, right = (
        device_table([{**d, "tables": d["num_tables"]} for d in m["per_device"]], digits=2)
        for m in (a, b)
    )
    w = len(left[0])
    rows = ["", "== measured on real FBGEMM kernels (ms) =="]
    rows.append(f"{'DreamShardPlanner':^{w}} | {'TorchRec default planner':^{w}}")
    rows += [f"{x} | {y}" for x, y in zip(left, right, strict=True)]
    change = 1.0 - a["step_ms"] / b["step_ms"]
    verdict = f"{change:.1%} lower" if change >= 0 else f"{-change:.1%} higher"
    for name, x, y in (
        ("step", a["step_ms"], b["step_ms"]),
        ("pred.", ours["predicted_step_ms"], theirs["predicted_step_ms"]),
        ("ckpt", ours["checkpoint_step_ms"], theirs["checkpoint_step_ms"]),
        ("plan s", ours["planning_s"], theirs["planning_s"]),
    ):
        rows.append(f"{name:>6} {x:>{w - 7}.3f} | {name:>6} {y:>{w - 7}.3f}")
    rows.append(
        f"DreamShard's measured step cost is {verdict} than TorchRec's ('pred.': the "
        "planner's cost network, calibrated where it calibrated; 'ckpt': the checkpoint's)"
    )
    return "\n".join(rows)


def train_demo(task, args: argparse.Namespace, profile: str | None = None) -> dict[str, Any]:
    """Rank 0's report of ``args.train_steps`` steps on ``args.train_ranks`` gloo ranks,
    planned from the machine profile at ``profile`` (``None``: the job measures its own)."""
    import torch.multiprocessing as mp

    from torchrec_dreamshard.ranks.spawn import free_port

    world = args.train_ranks
    print(f"\n== training {args.train_steps} steps under DistributedModelParallel ==")
    print(f"{world} gloo ranks on CPU, plan from DreamShardPlanner.collective_plan")
    if profile is not None:
        print("  planned from the machine profile the first plan measured (profile=...)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "train.json"
        settings = (args.checkpoint, args.calibrate, profile)
        job = (task.to_dict(), settings, args.train_steps, str(out))
        mp.spawn(_train_worker, args=(world, free_port(), job), nprocs=world, join=True)
        report = json.loads(out.read_text())
    print(f"  planned in {report['planning_s']:.1f} s on the training ranks")
    print("\n".join("  " + line for line in adaptation_lines(report["adaptation"])[2:]))
    for rank, n in enumerate(report["tables_per_rank"]):
        print(f"  rank {rank}: {n} tables")
    losses = ", ".join(f"{x:.4f}" for x in report["losses"])
    print(f"  loss per step: {losses}")
    return report


def _train_worker(rank: int, world: int, port: int, job: tuple) -> None:
    import torch

    from torchrec_dreamshard.ranks.spawn import exit_spawned_rank, local_process_group

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    with local_process_group(rank, world, port):
        report = _train(rank, world, *job[:3])
        if rank == 0:
            Path(job[3]).write_text(json.dumps(report))
    exit_spawned_rank()


def _train(rank: int, world: int, task_dict: dict, settings: tuple, steps: int) -> dict:
    """``steps`` training steps on this rank; ``settings``: checkpoint, calibrate, profile."""
    import torch
    import torch.distributed as dist
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim import RowWiseAdagrad

    from torchrec_dreamshard.data.tasks import Task
    from torchrec_dreamshard.evaluation.dmp_step import table_shardings
    from torchrec_dreamshard.evaluation.step_model import StepDLRM, StepModelSpec
    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.planner.adapters.torchrec_adapter import (
        heuristical_reservation,
        table_wise_constraints,
        torchrec_topology,
    )
    from torchrec_dreamshard.torchrec_compat import apply_optimizer_in_backward

    checkpoint, calibrate, profile = settings
    task = Task.from_dict(task_dict)
    model = StepDLRM(StepModelSpec(bags=task.tables), torch.device("meta"))
    apply_optimizer_in_backward(RowWiseAdagrad, model.sparse.parameters(), {"lr": LR})
    sharders = [EmbeddingBagCollectionSharder()]
    planner = DreamShardPlanner(
        topology=torchrec_topology(world, "cpu"),
        batch_size=TRAIN_LOCAL_BATCH,
        constraints=table_wise_constraints(task.tables),
        storage_reservation=heuristical_reservation(model, sharders),
        checkpoint=checkpoint,
        calibrate=calibrate,
        profile=profile,
    )
    start = time.perf_counter()
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    planning_s = time.perf_counter() - start
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense = [p for n, p in dmp.named_parameters() if ".sparse." not in n]
    opt = torch.optim.Adagrad(dense, lr=LR)
    losses = []
    for step in range(steps):
        loss, _ = dmp(_train_batch(task.tables, step, world, rank))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    ranks = [table["ranks"][0] for table in table_shardings(plan).values()]
    return {
        "ranks": world,
        "steps": steps,
        "losses": losses,
        "tables_per_rank": [ranks.count(r) for r in range(world)],
        "planning_s": planning_s,
        "adaptation": planner.adaptation,
    }


def _train_batch(tables: list, step: int, world: int, rank: int) -> Any:
    """``rank``'s batch of training step ``step`` (ids drawn to each table's statistics)."""
    import torch

    from torchrec_dreamshard.evaluation.step_model import DENSE_IN, StepBatch, sample_kjt

    g = torch.Generator().manual_seed(10_000 * step + rank)
    dense = torch.randn(TRAIN_LOCAL_BATCH, DENSE_IN, generator=g)
    kjt = sample_kjt(tables, TRAIN_LOCAL_BATCH, seed=1000 + step * world + rank)
    labels = torch.randint(0, 2, (TRAIN_LOCAL_BATCH,), generator=g).float()
    return StepBatch(dense=dense, bag_features=kjt, sequence_features=None, labels=labels)
