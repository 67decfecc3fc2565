"""The batch flags: ``--global-batch-size`` is one step's samples over all devices,
``--batch-size`` per rank (TorchRec's ``batch_size``; ``dreamshard steptime`` only)."""

from __future__ import annotations

import argparse
from typing import Any

GLOBAL_HELP = (
    "the global batch: samples of one step over all devices (TorchRec's per-rank "
    "batch_size is this over the devices)"
)
PER_RANK_HELP = "the per-rank batch: samples per rank per step (TorchRec's batch_size)"


class RenamedFlag(argparse.Action):
    """A renamed flag: using it is an error naming the new one."""

    def __init__(self, option_strings: list[str], dest: str, new: str, why: str, **kwargs):
        super().__init__(option_strings, dest, nargs=1, help=argparse.SUPPRESS, **kwargs)
        self.new, self.why = new, why

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option=None):
        parser.error(f"{option} was renamed {self.new} ({self.why})")


def add_global_batch_arg(p: argparse.ArgumentParser, default: int) -> None:
    """``--global-batch-size``, and ``--batch-size`` (its old name here) refused."""
    p.add_argument(
        "--global-batch-size",
        type=int,
        default=default,
        metavar="N",
        help=f"{GLOBAL_HELP} (default {default})",
    )
    p.add_argument(
        "--batch-size",
        action=RenamedFlag,
        dest="renamed_batch_size",
        new="--global-batch-size",
        why="the global batch; --batch-size means per rank, as TorchRec's batch_size",
    )
