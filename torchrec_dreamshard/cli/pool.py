"""``dreamshard pool``: the synthetic DLRM-shaped table pool and a sampled task."""

from __future__ import annotations

import argparse
import json

from torchrec_dreamshard.cli._batch_args import add_global_batch_arg

EXAMPLES = """examples:
  dreamshard pool --summary
  dreamshard pool --sample-task task.json --num-tables 40 --num-devices 4
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pool",
        help="summarise the synthetic table pool or write a sampled task",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scale", type=float, default=None, help="row scale (default: CPU scale)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--summary", action="store_true", help="print the pool's statistics")
    p.add_argument("--sample-task", metavar="TASK.json", help="write a task drawn from the pool")
    p.add_argument("--split", default="test", choices=["train", "test"])
    p.add_argument("--num-tables", type=int, default=40)
    p.add_argument("--num-devices", type=int, default=4)
    add_global_batch_arg(p, 2048)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torchrec_dreamshard.data.sampler import TaskSampler
    from torchrec_dreamshard.data.table_pool import (
        CPU_POOL_SCALE,
        DLRM_BATCH_SIZE,
        pool_access_share,
        pool_rows_accessed_once,
        synthetic_pool,
    )

    scale = CPU_POOL_SCALE if args.scale is None else args.scale
    pool = synthetic_pool(scale=scale, seed=args.seed)
    if args.summary or not args.sample_task:
        share = pool_access_share(pool, DLRM_BATCH_SIZE)
        summary = {
            "tables": len(pool),
            "scale": scale,
            "rows_min": min(t.rows for t in pool),
            "rows_max": max(t.rows for t in pool),
            "dims": sorted({t.dim for t in pool}),
            "pooling_min": min(t.pooling_factor for t in pool),
            "pooling_max": max(t.pooling_factor for t in pool),
            "access_share": [round(float(x), 4) for x in share],
            "rows_accessed_once": round(pool_rows_accessed_once(pool, DLRM_BATCH_SIZE), 4),
        }
        print(json.dumps(summary, indent=1))
    if args.sample_task:
        sampler = TaskSampler(pool, seed=args.seed)
        task = sampler.sample(
            args.split, args.num_tables, args.num_devices, batch_size=args.global_batch_size
        )
        task.save(args.sample_task)
        print(f"wrote {args.sample_task}: {len(task.tables)} tables on {task.num_devices} devices")
    return 0
