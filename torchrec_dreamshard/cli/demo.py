"""``dreamshard demo``: the main job on bundled defaults."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the main job on bundled defaults")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torchrec_dreamshard.tasks import CPU_POOL_SCALE, TaskSampler, synthetic_pool

    pool = synthetic_pool(scale=CPU_POOL_SCALE, seed=args.seed)
    task = TaskSampler(pool, seed=args.seed).sample("test", 60, 4)
    print(f"sampled a task of {len(task.tables)} DLRM-shaped tables on {task.num_devices} devices")
    for t in task.tables[:5]:
        print(f"  {t.name}: rows={t.rows} dim={t.dim} pooling={t.pooling_factor:.1f}")
    return 0
