"""Not a subcommand: what each rank runs to measure one plan on the distributed backend
(``torchrun --nproc-per-node 4 -m torchrec_dreamshard.cli.torchrun_measure TASK PLAN``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import torch

from torchrec_dreamshard.data.tasks import Task, placement_from_dict
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.distributed import measure_rank
from torchrec_dreamshard.store.cost_store import CostStore


def main(argv: Sequence[str] | None = None) -> int:
    import torch.distributed as dist

    p = argparse.ArgumentParser(prog="torchrec_dreamshard.cli.torchrun_measure")
    p.add_argument("task")
    p.add_argument("plan")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--optimizer", default="rowwise_adagrad")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--db", default=None, help="append the measurement to this SQLite store")
    args = p.parse_args(argv)
    config = MeasureConfig(device=args.device, optimizer=args.optimizer, precision=args.precision)
    if args.device == "cuda":
        import os

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    try:
        task = Task.load(args.task)
        placement = placement_from_dict(task, json.loads(open(args.plan).read())["placement"])
        out = measure_rank(task, placement, config)
        if out is not None:
            print(json.dumps(out.to_dict(), indent=1))
            if args.db:
                CostStore(args.db).append(task, placement, out, config)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
