"""``dreamshard train``: the DreamShard loop (collect, fit, train the policy), resumable."""

from __future__ import annotations

import argparse

EXAMPLES = """examples:
  dreamshard train --out-dir runs/cpu -n 10
  dreamshard train --out-dir runs/cpu -n 12          # resumes at iteration 11
  dreamshard train --out-dir runs/tiny -n 2 --num-tables 6 10 --boot-tasks 2 --collect-tasks 2
  dreamshard train --out-dir runs/zipf -n 4 --families zipf tight

Each iteration ends with OUT_DIR/checkpoint.pt, a row of OUT_DIR/metrics.csv and
OUT_DIR/curves.png. Killed at any point, the same command resumes from the last checkpoint
and skips every measurement already in the cost store.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    # No defaults here: an option left out keeps TrainConfig's default, the one source of them.
    p = sub.add_parser(
        "train",
        help="train a DreamShard agent on measured placements (resumable)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--out-dir", help="checkpoints and metrics")
    p.add_argument("--store", help="SQLite cost store (default OUT_DIR/costs.sqlite)")
    p.add_argument("-n", "--iterations", type=int, help="iterations N")
    p.add_argument("--seed", type=int)
    p.add_argument("--optimizer")
    p.add_argument("--backend", choices=["local", "distributed"])
    p.add_argument(
        "--families", nargs="+", help="task families to train on (default: all training families)"
    )
    p.add_argument(
        "--num-tables",
        type=int,
        nargs=2,
        metavar=("LO", "HI"),
        help="override every family's T range",
    )
    p.add_argument("--num-devices", type=int, nargs="+", help="override every family's D choices")
    p.add_argument("--boot-single", type=int, help="single tables measured first")
    p.add_argument("--boot-subsets", type=int, help="fused subsets measured first")
    p.add_argument("--boot-tasks", type=int, help="random-placement tasks first")
    p.add_argument("--boot-placements", type=int, help="random placements per bootstrap task")
    p.add_argument("--collect-tasks", type=int, help="tasks measured per iteration")
    p.add_argument("--placements-per-task", type=int)
    p.add_argument("--policy-updates", type=int, help="REINFORCE updates per iter")
    p.add_argument("--cost-epochs", type=int)
    p.add_argument(
        "--rounds", type=int, dest="measure_rounds", help="timing rounds per measurement"
    )
    p.add_argument(
        "--export", metavar="PATH", help="also copy the final checkpoint here (+ PATH.json)"
    )
    p.add_argument("--no-progress", action="store_false", dest="progress", help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses
    from pathlib import Path

    from torchrec_dreamshard.io import atomic_write, check_writable, dumps_strict
    from torchrec_dreamshard.policy.checkpoint import read_payload
    from torchrec_dreamshard.training import CHECKPOINT_NAME, TrainConfig, train

    export = getattr(args, "export", None)
    if export:  # before training, so a bad path never costs the run
        Path(export).parent.mkdir(parents=True, exist_ok=True)
        check_writable(export, "--export file")
    given = {
        f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if f.name in args
    }
    cfg = TrainConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()})
    agent = train(cfg)
    ckpt = Path(cfg.out_dir) / CHECKPOINT_NAME
    print(
        f"trained {agent.meta.get('measurements', 0)} measurements in "
        f"{agent.meta.get('train_wall_s', 0)} s; checkpoint {ckpt}"
    )
    if export:
        atomic_write(export, Path(ckpt).read_bytes(), "--export file")
        sidecar = Path(export).with_suffix(".json")
        atomic_write(sidecar, dumps_strict(read_payload(ckpt)["meta"]), "--export sidecar")
        print(f"copied to {export} (what it was trained on: {sidecar})")
    return 0
