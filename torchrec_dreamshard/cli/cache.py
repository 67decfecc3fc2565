"""``dreamshard cache``: show what the planner's cache holds, and clear it."""

from __future__ import annotations

import argparse

EXAMPLES = """examples:
  dreamshard cache                          # the cache directory and every item in it
  dreamshard cache --clear                  # remove everything the planner cached
  dreamshard cache --clear collectives      # remove one kind: measured again next plan
  dreamshard cache --cache-dir ./ds-cache   # the cache a planner with cache_dir= uses

The cache directory is $XDG_CACHE_HOME/torchrec_dreamshard (~/.cache/torchrec_dreamshard),
or the one DreamShardPlanner(cache_dir=...) names. Each item is shown with its kind, size,
age and the key it was measured under: host, device and its model, the threads the timers
ran on, torch and FBGEMM versions, and for collectives the topology. An item whose key
differs from this machine now is never read here. KIND is one of:
  reference_kernel  the reference kernel's time
  dense_kernel      the dense kernel's fitted model (data-parallel tables)
  sharding_path     a sharding path's measured step cost (the type choice's)
  collectives       the collectives' fitted models (per backend and topology)
  verification      verifications' measured rounds (per task and plan set)
  calibration       the calibration store (calibration.sqlite): measured kernels, and
                    what running jobs fed their tables; benchmarks' stores beside it
  fed_inputs        only what running jobs fed their tables (rows of the store)
Other files in the directory are left alone, and so is a store that
$DREAMSHARD_CALIBRATION_STORE names elsewhere.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cache",
        help="show what the planner measured and cached on this machine, or clear it",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--clear",
        nargs="?",
        const="all",
        metavar="KIND",
        help="remove every cached item (no KIND) or those of KIND (see below), "
        "printing what was removed",
    )
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="the cache directory (default: $XDG_CACHE_HOME/torchrec_dreamshard)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time

    from torchrec_dreamshard.cache.inventory import (
        cache_items,
        clear_cache,
        inventory_lines,
        other_files,
    )
    from torchrec_dreamshard.cache.location import using_cache_dir

    with using_cache_dir(args.cache_dir):
        if args.clear is not None:
            removed = clear_cache(args.clear)
            print("\n".join(removed) if removed else f"nothing to clear ({args.clear})")
            return 0
        items = cache_items()
        print("\n".join(inventory_lines(items, now=time.time())))
        others = other_files(items)
        if others:
            print(f"{len(others)} other file(s) in the directory, not the planner's: left alone")
    return 0
