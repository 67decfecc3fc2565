"""``dreamshard steptime``: planners against each other on the DMP training step, in
alternating rounds on gloo ranks (spawned, or torchrun's)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchrec_dreamshard.cli._batch_args import PER_RANK_HELP
from torchrec_dreamshard.cli._plan_args import table_wise_only

EXAMPLES = """examples:
  dreamshard steptime model.json
  dreamshard steptime model.json --planners torchrec,dreamshard --rounds 10 --out times.json
  torchrun --nproc-per-node 2 -m torchrec_dreamshard.cli.steptime model.json --rounds 10

MODEL.json is a task file ({"tables": [...]}, its other fields ignored) with optional
"sequence_tables": [...] (an EmbeddingCollection; one dim for all). Planners:
  torchrec       TorchRec's EmbeddingShardingPlanner, every sharding type
  torchrec-tw    the same, table-wise only
  dreamshard     DreamShardPlanner, every sharding type its constraints allow
  dreamshard-tw  DreamShardPlanner, table-wise only
  dreamshard-cal DreamShardPlanner calibrated on this machine first (calibrate=True:
                 its kernels measured within 60 s, cached for the next run)
"""

PLANNER_KINDS = ("torchrec", "torchrec-tw", "dreamshard", "dreamshard-tw", "dreamshard-cal")


@dataclass(frozen=True)
class NamedPlanner:
    """A planner factory for the step timer (picklable, so spawned ranks can run it).

    Attributes:
        kind: one of :data:`PLANNER_KINDS`.
        checkpoint: DreamShardPlanner's checkpoint (``None``: the bundled one).
    """

    kind: str
    checkpoint: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in PLANNER_KINDS:
            raise ValueError(f"unknown planner {self.kind!r}; known: {list(PLANNER_KINDS)}")

    def __call__(self, topology: Any, batch_size: int, constraints: Mapping[str, Any]) -> Any:
        from torchrec.distributed.planner import EmbeddingShardingPlanner

        from torchrec_dreamshard.planner import DreamShardPlanner

        if self.kind.endswith("-tw"):
            constraints = table_wise_only(constraints)
        if self.kind.startswith("torchrec"):
            return EmbeddingShardingPlanner(
                topology=topology,
                batch_size=batch_size,
                constraints=dict(constraints),
                debug=False,
            )
        return DreamShardPlanner(
            topology=topology,
            batch_size=batch_size,
            constraints=dict(constraints),
            checkpoint=self.checkpoint,
            debug=False,
            calibrate=True if self.kind.endswith("-cal") else None,
        )


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "steptime",
        help="time planners' plans on real DMP training steps, in alternating rounds",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODEL.json", help="the tables (a task file)")
    p.add_argument(
        "--planners",
        default="torchrec,dreamshard,dreamshard-tw",
        help="comma-separated planners; ratios are to the first",
    )
    p.add_argument("--checkpoint", metavar="PATH", help="DreamShard checkpoint (default: bundled)")
    p.add_argument("--world-size", type=int, default=2, help="ranks to spawn (without torchrun)")
    p.add_argument(
        "--batch-size", type=int, default=512, metavar="N", help=f"{PER_RANK_HELP} (default 512)"
    )
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per plan per round")
    p.add_argument("--steps", type=int, default=10, help="timed steps per plan per round")
    p.add_argument("--round-log", metavar="PATH", help="append each finished round (JSON lines)")
    p.add_argument("--out", metavar="TIMES.json", help="write every round's times as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torchrec_dreamshard.evaluation.dmp_step import StepTimerConfig
    from torchrec_dreamshard.evaluation.step_model import StepModelSpec
    from torchrec_dreamshard.io import atomic_write, check_writable, dumps_strict, read_json

    try:
        spec = StepModelSpec.from_dict(read_json(args.model, "model file"))
    except ValueError as exc:
        raise ValueError(f"model file {args.model!r}: {exc}") from None
    names = [n.strip() for n in args.planners.split(",") if n.strip()]
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"--planners must name distinct planners, got {args.planners!r}")
    plans = {n: NamedPlanner(n, args.checkpoint) for n in names}
    config = StepTimerConfig(
        batch_size=args.batch_size,
        rounds=args.rounds,
        warmup_steps=args.warmup,
        steps=args.steps,
    )
    if args.out:
        check_writable(args.out, "--out file")
    times = _time(spec, plans, config, args)
    if times is None:  # a torchrun rank other than 0
        return 0
    print("\n".join(report_lines(times.to_dict(), names[0])))
    if args.out:
        atomic_write(args.out, dumps_strict(times.to_dict()), "--out file")
        print(f"wrote {args.out}")
    return 0


def prepare_machine_models() -> None:
    """Fit (or load) this machine's models before the ranks start, so rank 0's planner
    finds them cached rather than measuring while the others wait."""
    from torchrec_dreamshard.cost.collective_models import load_collective_models
    from torchrec_dreamshard.cost.dense_kernel_model import load_dense_kernel_model
    from torchrec_dreamshard.cost.sharding_path_model import load_sharding_path_model

    load_collective_models(backend="gloo")
    load_dense_kernel_model(device="cpu")
    load_sharding_path_model(device="cpu")


def _time(spec: Any, plans: dict, config: Any, args: argparse.Namespace) -> Any:
    """Under torchrun: this rank's part (rank 0 gets the times); else spawn the ranks."""
    import torch.distributed as dist

    from torchrec_dreamshard.evaluation.dmp_step import run_rounds, time_plans

    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        prepare_machine_models()
        return time_plans(spec, plans, args.world_size, config, args.round_log)
    dist.init_process_group("gloo", init_method="env://")
    try:
        times = run_rounds(spec, plans, config, args.round_log)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return times if int(os.environ["RANK"]) == 0 else None


def report_lines(times: Mapping[str, Any], baseline: str) -> list[str]:
    """Each plan's median step and interval, its ratio to ``baseline`` and its sharding types."""
    from torchrec_dreamshard.evaluation.dmp_step import sharding_type_counts
    from torchrec_dreamshard.evaluation.step_stats import median_interval, ratio_interval, verdict

    rounds = times["rounds"]
    if not rounds:
        return ["no rounds were timed"]
    ms = {name: [r["step_ms"][name] for r in rounds] for name in times["plans"]}
    coverage = median_interval(ms[baseline]).coverage
    lines = [
        f"{len(rounds)} rounds on {times['world_size']} ranks: medians [interval holding the "
        f"median with probability {coverage:.1%}]",
        f"{'plan':16s} {'step ms':>26s}  {'/ ' + baseline:>26s}  sharding types",
    ]
    for name, values in ms.items():
        m = median_interval(values)
        step = f"{m.median:8.2f} [{m.low:8.2f}, {m.high:8.2f}]"
        ratio = "-"
        if name != baseline:
            r = ratio_interval(values, ms[baseline])
            ratio = f"{r.median:7.3f} [{r.low:6.3f}, {r.high:6.3f}]"
        types = sharding_type_counts(times["plans"][name]["tables"])
        kinds = ", ".join(f"{k} {v}" for k, v in types.items())
        lines.append(f"{name:16s} {step:>26s}  {ratio:>26s}  {kinds}")
    for name in ms:
        if name != baseline:
            r = ratio_interval(ms[name], ms[baseline])
            lines.append(f"{name} / {baseline}: {verdict(r, name, baseline)}")
    if coverage < 0.95:
        lines.append("(fewer than 6 rounds: the intervals are [min, max], below 95%)")
    return lines


if __name__ == "__main__":  # torchrun -m torchrec_dreamshard.cli.steptime ...
    from torchrec_dreamshard.cli import main

    code = main(["steptime", *sys.argv[1:]])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skips C++ static destructors after DMP on gloo (spawn.exit_spawned_rank)
