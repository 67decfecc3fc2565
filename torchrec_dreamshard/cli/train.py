"""``dreamshard train``: the DreamShard loop (collect, fit the cost network, train the
policy), resumable."""

from __future__ import annotations

import argparse

EXAMPLES = """examples:
  dreamshard train --out-dir runs/cpu -n 10
  dreamshard train --out-dir runs/cpu -n 12          # resumes at iteration 11
  dreamshard train --out-dir runs/tiny -n 2 --num-tables 6 10 --boot-tasks 2 --collect-tasks 2

Each iteration ends with OUT_DIR/checkpoint.pt, a row of OUT_DIR/metrics.csv and
OUT_DIR/curves.png. Killed at any point, the same command resumes from the last checkpoint
and skips every measurement already in the cost store.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a DreamShard agent on measured placements (resumable)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out-dir", default="runs/dreamshard", help="checkpoints and metrics")
    p.add_argument("--store", default=None, help="SQLite cost store (default OUT_DIR/costs.sqlite)")
    p.add_argument("-n", "--iterations", type=int, default=8, help="iterations N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--optimizer", default="rowwise_adagrad")
    p.add_argument("--backend", default="local", choices=["local", "distributed"])
    p.add_argument("--num-tables", type=int, nargs=2, default=[20, 60], metavar=("LO", "HI"))
    p.add_argument("--num-devices", type=int, nargs="+", default=[2, 4])
    p.add_argument("--boot-single", type=int, default=512, help="single tables measured first")
    p.add_argument("--boot-subsets", type=int, default=200, help="fused subsets measured first")
    p.add_argument("--boot-tasks", type=int, default=12, help="random-placement tasks first")
    p.add_argument("--collect-tasks", type=int, default=6, help="tasks measured per iteration")
    p.add_argument("--placements-per-task", type=int, default=4)
    p.add_argument("--policy-updates", type=int, default=60, help="REINFORCE updates per iter")
    p.add_argument("--cost-epochs", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3, help="timing rounds per measurement")
    p.add_argument(
        "--export", metavar="PATH", help="also copy the final checkpoint here (+ PATH.json)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import shutil
    from pathlib import Path

    from torchrec_dreamshard.checkpoint import read_payload
    from torchrec_dreamshard.training import CHECKPOINT_NAME, TrainConfig, train

    cfg = TrainConfig(
        out_dir=args.out_dir,
        store=args.store,
        iterations=args.iterations,
        seed=args.seed,
        batch_size=args.batch_size,
        optimizer=args.optimizer,
        backend=args.backend,
        num_tables=tuple(args.num_tables),
        num_devices=tuple(args.num_devices),
        boot_single=args.boot_single,
        boot_subsets=args.boot_subsets,
        boot_tasks=args.boot_tasks,
        collect_tasks=args.collect_tasks,
        placements_per_task=args.placements_per_task,
        policy_updates=args.policy_updates,
        cost_epochs=args.cost_epochs,
        measure_rounds=args.rounds,
        progress=not args.no_progress,
    )
    agent = train(cfg)
    ckpt = Path(cfg.out_dir) / CHECKPOINT_NAME
    print(
        f"trained {agent.meta.get('measurements', 0)} measurements in "
        f"{agent.meta.get('train_wall_s', 0)} s; checkpoint {ckpt}"
    )
    if args.export:
        Path(args.export).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ckpt, args.export)
        sidecar = Path(args.export).with_suffix(".json")
        sidecar.write_text(json.dumps(read_payload(ckpt)["meta"], indent=1) + "\n")
        print(f"copied to {args.export} (what it was trained on: {sidecar})")
    return 0
