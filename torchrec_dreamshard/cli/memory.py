"""``dreamshard memory``: what each device of a plan will allocate, measured on the real
kernels before any job starts."""

from __future__ import annotations

import argparse

EXAMPLES = """examples:
  dreamshard memory task.json plan.json
  dreamshard memory task.json plan.json --optimizer rowwise_adagrad --out memory.json

TASK.json: the task `dreamshard plan` planned (tables, devices, memory_bytes, global
batch_size); PLAN.json: what `dreamshard plan --out` wrote ("placement": table -> device,
and "shards" of split tables). Each device's shards are built in turn as FBGEMM's fused
CPU kernel with the optimizer's state, and one forward and backward on ids drawn to the
tables' pooling factors gives the per-step buffers (the ids, the pooled output and its
gradient). For a TorchRec ShardingPlan in Python: feedback.memory_check.check_plan.
"""

OPTIMIZERS = {
    "sgd": "EXACT_SGD",
    "adagrad": "EXACT_ADAGRAD",
    "rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD",
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "memory",
        help="measure what each device of a plan will allocate, before the job",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("task", metavar="TASK.json", help="the task file")
    p.add_argument("plan", metavar="PLAN.json", help="a plan of it (dreamshard plan --out)")
    p.add_argument(
        "--optimizer", choices=sorted(OPTIMIZERS), default="adagrad", help="the fused optimizer"
    )
    p.add_argument("--out", metavar="MEMORY.json", help="write the per-device bytes as JSON")
    p.set_defaults(func=run)


def plan_shards(task: object, plan: dict) -> list[list[tuple[str, list[int], str]]]:
    """Per device, ``(table, [rows, cols], sharding type)`` of the shards ``plan`` puts there."""
    from torchrec_dreamshard.data.tasks import placement_from_dict

    tables = {t.name: t for t in task.tables}  # type: ignore[attr-defined]
    out: list[list[tuple[str, list[int], str]]] = [[] for _ in range(task.num_devices)]  # type: ignore[attr-defined]
    shards = plan.get("shards") or {}
    whole = {n: d for n, d in (plan.get("placement") or {}).items() if n not in shards}
    if not shards:
        placement_from_dict(task, whole)  # checks every table is placed once
    for name, device in whole.items():
        if name not in tables or not 0 <= int(device) < len(out):
            raise ValueError(f"plan places table {name!r} on device {device!r}: not in the task")
        out[int(device)].append((name, [tables[name].rows, tables[name].dim], "table_wise"))
    for name, parts in shards.items():
        for part in parts:
            start, end = part["columns"]
            out[int(part["device"])].append((name, [tables[name].rows, end - start], "column_wise"))
    return out


def run(args: argparse.Namespace) -> int:
    import json
    from types import SimpleNamespace

    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from torchrec_dreamshard.data.task_fields import per_rank_batch
    from torchrec_dreamshard.data.tasks import Task
    from torchrec_dreamshard.feedback.memory_check import check_lines, check_rank
    from torchrec_dreamshard.io import check_writable, read_json

    if args.out:
        check_writable(args.out, "--out file")
    task = Task.load(args.task)
    plan = read_json(args.plan, "plan file")
    if not isinstance(plan, dict):
        raise ValueError(f"plan file {args.plan!r}: a JSON object is needed")
    configs = {
        t.name: (
            "",
            SimpleNamespace(num_embeddings=t.rows, embedding_dim=t.dim, feature_names=[t.name]),
        )
        for t in task.tables
    }
    pooling = {t.name: t.pooling_factor for t in task.tables}
    world = task.num_devices
    batch = per_rank_batch(task.batch_size, world)
    optimizer = getattr(EmbOptimType, OPTIMIZERS[args.optimizer])
    ranks = []
    for rank, shards in enumerate(plan_shards(task, plan)):
        tables = check_rank(shards, configs, batch, world, optimizer, pooling)
        ranks.append(
            {"rank": rank, "tables": tables, "total": sum(sum(p.values()) for p in tables.values())}
        )
    print("\n".join(check_lines(ranks, task.memory)))
    over = [r["rank"] for r in ranks if r["total"] > task.memory[r["rank"]]]
    if over:
        print(f"devices over their memory: {over}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"devices": ranks, "over": over}, f, indent=1)
        print(f"wrote {args.out}")
    return 0
