"""The ``dreamshard`` command: one module per subcommand, each with ``add_parser`` and
``run``. Subcommands import their heavy dependencies inside ``run`` so that ``--help`` is
fast."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules under torchrec_dreamshard.cli, one per subcommand (named like the subcommand).
SUBCOMMANDS = [
    "collect",
    "demo",
    "evaluate",
    "plan",
    "pool",
    "train",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dreamshard",
        description="Learned embedding-table sharding for TorchRec (after DreamShard).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        mod = importlib.import_module(f"torchrec_dreamshard.cli.{module}")
        mod.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ValueError as exc:  # bad input: say what was wrong, no traceback
        print(f"dreamshard {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dreamshard {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
