"""``dreamshard evaluate``: measure one plan on real kernels and print its per-device costs."""

from __future__ import annotations

import argparse
import json

from torchrec_dreamshard.cli._measure_args import add_measure_args, config_from_args

EXAMPLES = """examples:
  dreamshard evaluate task.json plan.json
  dreamshard evaluate task.json plan.json --backend distributed --db costs.sqlite --json

PLAN.json is {"placement": {"t0": 2, "t1": 0, ...}, ...} (what `dreamshard plan` writes),
with column-wise split tables in "shards": {"t2": [{"device": 0, "columns": [0, 64]},
{"device": 1, "columns": [64, 128]}]}; each shard is timed as a table of its columns.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="measure a plan on real kernels and print its per-device costs",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("task", metavar="TASK.json")
    p.add_argument("plan", metavar="PLAN.json")
    p.add_argument("--db", metavar="PATH", help="also append the measurement to this store")
    p.add_argument("--json", action="store_true", help="print the measurement as JSON")
    p.add_argument("--seed", type=int, default=None)
    add_measure_args(p)
    p.set_defaults(func=run)


def load_plan(path: str) -> dict:
    """The plan file's JSON object (which must hold ``placement``)."""
    from torchrec_dreamshard.io import read_json

    data = read_json(path, "plan file")
    if not isinstance(data, dict) or not isinstance(data.get("placement"), dict):
        raise ValueError(f'plan file {path!r} must hold {{"placement": {{"table": device}}}}')
    if not isinstance(data.get("shards", {}), dict):
        raise ValueError(f'plan file {path!r}: "shards" must be {{"table": [shards]}}')
    other = data.get("sharding") or {}
    if other:  # dreamshard plan's tables of other sharding types
        kinds = {
            name: t.get("sharding_type") if isinstance(t, dict) else t for name, t in other.items()
        }
        raise ValueError(
            f"plan file {path!r} shards tables {dict(list(kinds.items())[:10])} otherwise than "
            "table-wise or column-wise on the fused kernel, which is all evaluate measures; "
            "plan with --no-splits for a table-wise plan, or time the plan's training steps "
            "(dreamshard steptime)"
        )
    return data


def run(args: argparse.Namespace) -> int:
    from torchrec_dreamshard.cost.collective_models import local_all_to_all
    from torchrec_dreamshard.data.splits import plan_from_entries
    from torchrec_dreamshard.data.tasks import Task
    from torchrec_dreamshard.measure import measure_placement
    from torchrec_dreamshard.store import CostStore

    config = config_from_args(args)
    task = Task.load(args.task, allow_oversized=True)
    plan = load_plan(args.plan)
    try:
        sharded, placement = plan_from_entries(task, plan["placement"], plan.get("shards"))
    except ValueError as exc:
        raise ValueError(f"plan file {args.plan!r}: {exc}") from None
    task = sharded.shards  # a shard is timed as a table of its columns
    comm = local_all_to_all(task.num_devices, args.backend, config.comm_model_path)
    if args.db:  # the store's collector lock: no collector's timings skew ours, or ours theirs
        with CostStore(args.db) as store, store.collector_lock("dreamshard evaluate"):
            store.fingerprint(config, args.backend)  # before measuring
            m = measure_placement(task, placement, config, backend=args.backend, comm=comm)
            store.append(task, placement, m, config)
    else:
        m = measure_placement(task, placement, config, backend=args.backend, comm=comm)
    if args.json:
        print(json.dumps(m.to_dict(), indent=1))
    else:
        _print_table(task, placement, m)
    if not m.ok:
        print(f"measurement failed: {m.error}")
        return 1
    return 0


def _print_table(task, placement, m) -> None:
    from torchrec_dreamshard.data.tasks import device_tables
    from torchrec_dreamshard.device_report import device_table

    if not m.ok:
        return
    rows = [
        {"tables": len(idx), "fwd_ms": c.fwd_ms, "bwd_ms": c.bwd_ms, "comm_ms": c.comm_ms}
        for idx, c in zip(device_tables(task, placement), m.per_device, strict=True)
    ]
    print("\n".join(device_table(rows, digits=2)))
    print(
        f"step_ms {m.step_ms:.2f} (spread {100 * m.spread:.1f}% over rounds; reference kernel "
        f"{m.reference_ms:.2f} ms; backend {m.backend}; comm {m.comm_source})"
    )
