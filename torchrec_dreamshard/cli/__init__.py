"""The ``dreamshard`` command: one module per subcommand, each with ``add_parser`` and
``run`` (which imports the heavy dependencies, so ``--help`` is fast)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules under torchrec_dreamshard.cli, one per subcommand (named like the subcommand).
SUBCOMMANDS = [
    "cache",
    "calibrate",
    "collect",
    "demo",
    "evaluate",
    "memory",
    "plan",
    "pool",
    "profile",
    "report",
    "steptime",
    "train",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dreamshard",
        description="Learned embedding-table sharding for TorchRec (after DreamShard).",
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of every error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        mod = importlib.import_module(f"torchrec_dreamshard.cli.{module}")
        mod.add_parser(sub)
    return parser


def error_message(exc: BaseException) -> str | None:
    """The one-line message of an expected failure, or ``None`` for a bug (keep the traceback)."""
    import sqlite3

    if isinstance(exc, OSError):
        name = f" {exc.filename!r}" if exc.filename else ""
        text = f"{exc.strerror or exc}{':' if name else ''}{name}"
    elif isinstance(exc, sqlite3.Error):
        text = f"cost store database error: {exc}"
    elif isinstance(exc, MemoryError):
        text = "out of memory: an input is too large (see the README's 'Limits and errors')"
    elif isinstance(exc, RecursionError):
        text = "an input is nested too deeply"
    elif isinstance(exc, OverflowError):
        text = f"a number is too large: {exc}"
    elif isinstance(exc, ValueError):
        text = str(exc)
    else:
        return None
    return " ".join(text.split()) or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # accepted anywhere on the line
    args = parser.parse_args([a for a in argv if a != "--debug"])
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"dreamshard {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one boundary: expected failures are one line, exit code 2
        message = error_message(exc)
        if message is None or debug:
            raise
        print(f"dreamshard {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
