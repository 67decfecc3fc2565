"""``dreamshard calibrate``: fine-tune the cost network on a task's tables measured here."""

from __future__ import annotations

import argparse

EXAMPLES = """examples:
  dreamshard calibrate task.json
  dreamshard calibrate task.json --budget-s 30 --store costs.sqlite --export my.pt
  dreamshard plan task.json --checkpoint my.pt

The measurements are kept in the store (by machine, workload and table contents), so a
second calibration, or `dreamshard plan --calibrate`, of the same tables measures nothing.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    from torchrec_dreamshard.cli._plan_args import add_calibration_args

    p = sub.add_parser(
        "calibrate",
        help="measure a task's tables on this machine and fine-tune the cost network",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("task", metavar="TASK.json", help="the task file")
    p.add_argument("--checkpoint", metavar="PATH", help="prior checkpoint (default: bundled)")
    add_calibration_args(p, flag=False)
    p.add_argument("--export", metavar="PATH.pt", help="write the calibrated checkpoint")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torchrec_dreamshard.calibration import CalibrationConfig, calibrate
    from torchrec_dreamshard.data.tasks import Task
    from torchrec_dreamshard.io import check_writable
    from torchrec_dreamshard.planner.stages.candidates import default_sources
    from torchrec_dreamshard.policy.checkpoint import load_checkpoint, save_checkpoint

    budget = 60.0 if args.budget_s is None else args.budget_s
    config = CalibrationConfig(budget_s=budget, store=args.store, seed=args.seed)
    if args.export:
        check_writable(args.export, "--export file")
    task = Task.load(args.task)
    agent = load_checkpoint(args.checkpoint, sources=default_sources())
    result = calibrate(agent, task, config)
    print("\n".join(result.lines()))
    if args.export:
        save_checkpoint(result.agent, args.export)
        print(f"wrote {args.export}")
    return 0
