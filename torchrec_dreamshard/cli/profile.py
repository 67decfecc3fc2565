"""``dreamshard profile``: measure this machine's profile once for every job on the same
hardware to plan from (``DreamShardPlanner(profile=PATH)``), or ``--show`` one."""

from __future__ import annotations

import argparse
import json

EXAMPLES = """examples:
  dreamshard profile --out machine.profile --devices 8
  dreamshard profile --out machine.profile --devices 8 --task task.json --budget-s 60
  dreamshard profile --show machine.profile
  dreamshard plan task.json --profile machine.profile --out plan

One node measures the profile; every job on the same hardware plans from it, measuring
nothing. A profile records what it was measured on (CPU or GPU model, threads, torch and
FBGEMM versions, world size): a planner given one from other hardware says so.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="measure this machine's profile for the planner (or --show one)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", metavar="PATH", help="where to write the profile")
    p.add_argument("--show", metavar="PATH", help="print a profile file and exit")
    p.add_argument("--devices", type=int, default=2, help="the world size planned for")
    p.add_argument("--local-devices", type=int, help="devices per host (default: all)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--task", metavar="TASK.json", help="calibrate on this task's tables")
    p.add_argument("--budget-s", type=float, default=60.0, help="calibration's seconds")
    p.add_argument(
        "--drift-limit",
        type=float,
        default=None,
        help="discard calibration kernels measured while the reference kernel moved by more "
        "than this fraction (default 0.2; inf: no check)",
    )
    p.add_argument("--checkpoint", metavar="PATH", help="the checkpoint the planner uses")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torchrec_dreamshard.profile.machine_profile import MachineProfile

    if args.show:
        print(json.dumps(MachineProfile.load(args.show).summary(), indent=1))
        return 0
    if not args.out:
        raise ValueError("give --out PATH to write the profile (or --show PATH to read one)")
    profile = measure_profile(args)
    profile.save(args.out)
    print(json.dumps(profile.summary(), indent=1))
    print(f"wrote {args.out}")
    return 0


def measure_profile(args: argparse.Namespace):
    """The profile ``args`` ask for, measured here."""
    from torchrec_dreamshard.calibration import CalibrationConfig
    from torchrec_dreamshard.data.tasks import Task
    from torchrec_dreamshard.io import check_writable
    from torchrec_dreamshard.measure.config import MeasureConfig
    from torchrec_dreamshard.planner.adapters.topology import torchrec_topology
    from torchrec_dreamshard.planner.stages.candidates import default_sources
    from torchrec_dreamshard.planner.steps.machine_sources import machine_sources
    from torchrec_dreamshard.policy.checkpoint import load_checkpoint
    from torchrec_dreamshard.profile.budget import Budget
    from torchrec_dreamshard.profile.build import ProfileRequest, build_profile
    from torchrec_dreamshard.profile.stamp import MachineStamp

    if args.devices < 1:
        raise ValueError(f"--devices must be >= 1, got {args.devices}")
    local = args.local_devices or args.devices
    if local < 1 or args.devices % local:
        raise ValueError(f"--local-devices ({local}) must divide --devices ({args.devices})")
    check_writable(args.out, "--out file")
    task = Task.load(args.task) if args.task else None
    topology = torchrec_topology(args.devices, args.device, local_world_size=local)
    sources = machine_sources(topology)
    drift = {} if args.drift_limit is None else {"drift_limit": args.drift_limit}
    calibration = CalibrationConfig(
        budget_s=args.budget_s, measure=MeasureConfig(device=args.device), **drift
    )
    request = ProfileRequest(
        stamp=MachineStamp.here(args.device, args.devices, local),
        reference=sources.reference,
        collectives=sources.collectives if args.devices > 1 else None,
        collectives_source=sources.collectives_source,
        dense_kernel=sources.dense_kernel,
        sharding_path=sources.sharding_path if args.devices > 1 else None,
        calibration=calibration if task is not None else None,
        auto=False,
        task=(lambda: task) if task is not None else None,
        sources=default_sources(),
    )
    prior = load_checkpoint(args.checkpoint, sources=default_sources())
    return build_profile(prior, request, Budget(None))
