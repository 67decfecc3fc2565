"""``dreamshard collect``: measure many placements and append them to a cost dataset."""

from __future__ import annotations

import argparse
import sys

from torchrec_dreamshard.cli._batch_args import add_global_batch_arg
from torchrec_dreamshard.cli._measure_args import add_measure_args, config_from_args

EXAMPLES = """examples:
  dreamshard collect --db costs.sqlite -n 200
  dreamshard collect --db costs.sqlite -n 50 --placer size_greedy --backend distributed
  dreamshard collect --db costs.sqlite -n 20 --task-file task.json

Every measurement is committed as it finishes. Ctrl-C stops cleanly; run the same command
again to resume where it stopped (jobs already in the database are skipped).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "collect",
        help="measure placements on real kernels into a SQLite cost dataset",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--db", required=True, metavar="PATH", help="SQLite cost dataset")
    p.add_argument("-n", "--num", type=int, default=100, help="placements to measure")
    p.add_argument("--task-file", metavar="TASK.json", help="a task (or a JSON list of tasks)")
    p.add_argument(
        "--placer",
        default="random",
        help="'random', a heuristic's name (size_greedy, ...) or 'torchrec' (the placers "
        "of torchrec_dreamshard.evaluation.placers that need no agent)",
    )
    p.add_argument("--per-task", type=int, default=4, help="placements per sampled task")
    p.add_argument("--num-tables", type=int, nargs=2, default=[20, 40], metavar=("LO", "HI"))
    p.add_argument("--num-devices", type=int, nargs="+", default=[2, 4])
    add_global_batch_arg(p, 2048)
    p.add_argument("--split", default="train", choices=["train", "test"])
    p.add_argument("--scale", type=float, default=None, help="pool row scale (default: CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_measure_args(p)
    p.set_defaults(func=run)


def _tasks(args: argparse.Namespace, count: int) -> list:
    from torchrec_dreamshard.data.sampler import TaskSampler
    from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool
    from torchrec_dreamshard.data.tasks import Task, warn_old_batch_key
    from torchrec_dreamshard.io import read_json

    if args.task_file:
        data = read_json(args.task_file, "task file")
        warn_old_batch_key(data, args.task_file)
        items = data if isinstance(data, list) else [data]
        try:
            return [Task.from_dict(d) for d in items]
        except ValueError as exc:
            raise ValueError(f"task file {args.task_file!r}: {exc}") from None
    scale = CPU_POOL_SCALE if args.scale is None else args.scale
    sampler = TaskSampler(synthetic_pool(scale=scale, seed=args.seed), seed=args.seed)
    lo, hi = args.num_tables
    return [
        sampler.sample(args.split, (lo, hi), args.num_devices, batch_size=args.global_batch_size)
        for _ in range(count)
    ]


def _placement(args: argparse.Namespace, task, job: int) -> list[int]:
    if args.placer == "random":
        from torchrec_dreamshard.measure import random_placement

        return random_placement(task, [args.seed, job])
    from torchrec_dreamshard.evaluation.placers import place

    return list(place(args.placer, task, seed=job))


def _collection_key(args: argparse.Namespace, config, tasks: list) -> str:
    """The resume key: the options that decide the jobs and a task file's content."""
    from torchrec_dreamshard.measure.config import stable_key

    keys = ("placer", "per_task", "num_tables", "num_devices", "split", "scale", "seed")
    options = {k: getattr(args, k) for k in (*keys, "backend")}
    options["batch_size"] = args.global_batch_size  # the key's name before the flag's rename
    if args.task_file:
        options["tasks"] = stable_key([t.to_dict() for t in tasks], 16)
    return stable_key([options, config.to_dict()], 10)


def run(args: argparse.Namespace) -> int:
    from torchrec_dreamshard.store import CostStore

    if args.num < 1 or args.per_task < 1:
        raise ValueError("-n and --per-task must be >= 1")
    config = config_from_args(args)
    tasks = _tasks(args, -(-args.num // args.per_task))
    with CostStore(args.db) as store, store.collector_lock("dreamshard collect"):
        return _collect(args, config, tasks, store)


def _collect(args: argparse.Namespace, config, tasks: list, store) -> int:
    from tqdm import tqdm

    from torchrec_dreamshard.cost.collective_models import local_all_to_all
    from torchrec_dreamshard.measure import measure_placement

    prefix = _collection_key(args, config, tasks) + ":"
    # the fingerprint first (fails before measuring): another machine's rows are not ours
    fingerprint = store.fingerprint(config, args.backend)
    done = store.done_jobs(prefix, fingerprint)
    todo = [i for i in range(args.num) if f"{prefix}{i}" not in done]
    print(f"collection {prefix[:-1]}: {args.num - len(todo)}/{args.num} already in {args.db}")
    failed = 0
    bar = tqdm(
        total=args.num,
        initial=args.num - len(todo),
        disable=args.no_progress,
        unit="placement",
        file=sys.stderr,
    )
    try:
        for i in todo:
            task = tasks[(i // args.per_task) % len(tasks)]
            placement = _placement(args, task, i)
            comm = local_all_to_all(task.num_devices, args.backend, config.comm_model_path)
            m = measure_placement(task, placement, config, backend=args.backend, comm=comm)
            store.append(task, placement, m, config, job=f"{prefix}{i}")
            failed += not m.ok
            bar.update(1)
            bar.set_postfix(step_ms=f"{m.step_ms:.1f}", failed=failed)
    except KeyboardInterrupt:
        bar.close()
        n = store.count(fingerprint=fingerprint, job_prefix=prefix)
        print(
            f"stopped: {n}/{args.num} measurements are in {args.db}; "
            "run the same command again to resume"
        )
        return 130
    finally:
        bar.close()
        _close_pools()
    print(f"done: {args.num}/{args.num} measurements in {args.db} ({failed} failed this run)")
    return 0


def _close_pools() -> None:
    mod = sys.modules.get("torchrec_dreamshard.measure.distributed")
    if mod is not None:
        mod.close_pools()
