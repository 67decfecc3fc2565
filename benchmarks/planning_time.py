"""Planning time: DreamShardPlanner against TorchRec's planners, in two questions.

Every run plans the same meta-device model: an ``EmbeddingBagCollection`` of T tables drawn
from the synthetic DLRM-shaped pool (full scale, ``synthetic_pool(num_tables=T)``) with
their pooling factors as ``ParameterConstraints``, on D CUDA devices of 80 GB (planning
needs no GPU), per-rank batch 512. Each run is a fresh process; the figure is the wall time
of ``planner.plan(model, sharders)`` alone (imports, model building and the planner's
constructor, which loads the checkpoint, excluded).

``--compare`` (the question of the planning-time issue): DreamShardPlanner beside TorchRec's
planner restricted to table-wise sharding, in alternating rounds (the order rotates each
round), ``--repeats`` runs of each, medians and spread:

- ``dreamshard``: ``DreamShardPlanner(topology, batch_size, constraints)``, every default:
  the safe mode and ``calibrate=None``, which checks this machine and calibrates where the
  checkpoint misprices it. That first-run measuring happens inside ``plan`` and would be
  timed; here it measures nothing: the topology is CUDA and this process has no GPU, so
  the reference kernel is not timed, no calibration runs, the collectives are analytic
  and the dense kernel unmeasured (each row keeps ``planner.adaptation``, which says so);
- ``dreamshard-nocal``: the same with ``calibrate=False``: the placement alone;
- ``torchrec-table-wise``: ``EmbeddingShardingPlanner`` with
  ``ParameterConstraints(sharding_types=["table_wise"], pooling_factors=...)`` for every
  table (TorchRec then walks its proposers over each table's compute kernels);
- ``torchrec-table-wise-fused``: the same with ``compute_kernels=["fused"]``: table-wise on
  the fused kernel, the search space DreamShard's policy places.

``--baseline-tree DIR`` adds ``dreamshard@baseline`` (and ``-nocal``) planned by the
``torchrec_dreamshard`` package in another checkout (``git worktree`` or ``git archive``
of an earlier commit), so a change can be timed beside the code before it.

The grid (the default): DreamShard's three modes against TorchRec's default planner, 50 to
2000 tables on 8 to 128 devices. TorchRec's planner is given ``timeout_seconds=CAP`` and
its process is killed at ``CAP + HARD_MARGIN`` seconds (its enumeration is not covered by
its own timeout).

    .venv/bin/python benchmarks/planning_time.py --compare --tables 1000 --devices 64
    .venv/bin/python benchmarks/planning_time.py            # the full grid
    .venv/bin/python benchmarks/planning_time.py --tables 50 200 --devices 8 --cap 30

Writes ``benchmarks/results/planning_time.json`` (raw rows: ``rows`` for the grid,
``comparison`` for ``--compare``; a run of one keeps the other's) and ``.md`` (both tables).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import multiprocessing as mp
import os
import platform
import queue
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

# Nothing of torchrec_dreamshard is imported at the top: a run is a spawned process that
# loads this module first, and a run of --baseline-tree must import the other checkout's
# package (import_package_from), not this one's.

TABLES = (50, 200, 1000, 2000)
DEVICES = (8, 64, 128)
LOCAL_BATCH = 512
HBM_CAP = 80 * 2**30  # bytes per device
CAP_S = 120  # TorchRec planner timeout, seconds
HARD_MARGIN = 60  # seconds past the cap before the process is killed
PLANNERS = ("dreamshard-safe", "dreamshard-greedy", "dreamshard-search", "torchrec")
COMPARED = ("dreamshard", "dreamshard-nocal", "torchrec-table-wise", "torchrec-table-wise-fused")
BASELINE = "@baseline"  # suffix of the planners run from --baseline-tree
REFERENCE = "torchrec-table-wise-fused"  # the ratio's denominator: the 0.95 s planner
COMPARE_LIMIT_S = 900  # seconds before a comparison run's process is killed
TARGET_S, TARGET_RATIO = 2.0, 1.5  # the bar: under 2 s, at most 1.5x TorchRec's
CODE = (":/torchrec_dreamshard", ":/benchmarks/*.py")  # what the figures depend on (git paths)


def build(num_tables: int):
    """The meta-device model and its constraints."""
    import torch
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from torchrec_dreamshard.data.table_pool import synthetic_pool

    pool = synthetic_pool(num_tables=num_tables, seed=0)
    configs = [
        EmbeddingBagConfig(
            name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[f"f_{t.name}"]
        )
        for t in pool
    ]
    constraints = {t.name: ParameterConstraints(pooling_factors=[t.pooling_factor]) for t in pool}
    return EmbeddingBagCollection(tables=configs, device=torch.device("meta")), constraints


def topology(devices: int):
    from torchrec.distributed.planner.types import Topology

    return Topology(world_size=devices, compute_device="cuda", hbm_cap=HBM_CAP)


def make_planner(name: str, devices: int, constraints: dict, checkpoint: str | None, cap: int):
    """A planner of the grid."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    if name == "torchrec":
        return EmbeddingShardingPlanner(
            topology=topology(devices),
            batch_size=LOCAL_BATCH,
            constraints=constraints,
            timeout_seconds=cap,
        )
    from torchrec_dreamshard.planner import DreamShardPlanner

    return DreamShardPlanner(
        topology=topology(devices),
        batch_size=LOCAL_BATCH,
        constraints=constraints,
        agent=load_agent(checkpoint),
        mode=name.split("-")[1],
    )


def load_agent(checkpoint: str | None):
    """The given checkpoint, else the bundled one, else an untrained agent (same speed)."""
    from torchrec_dreamshard.planner.stages.candidates import default_sources
    from torchrec_dreamshard.policy import DreamShard
    from torchrec_dreamshard.policy.checkpoint import BUNDLED_CHECKPOINT, load_checkpoint

    if checkpoint is None and not BUNDLED_CHECKPOINT.is_file():
        return DreamShard.untrained(seed=0, sources=default_sources())
    return load_checkpoint(checkpoint, sources=default_sources())


def one_run(name: str, tables: int, devices: int, checkpoint: str | None, cap: int, out) -> None:
    """Child process: plan once, put the row on ``out``."""
    import torch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    model, constraints = build(tables)
    planner = make_planner(name, devices, constraints, checkpoint, cap)
    start = time.perf_counter()
    try:
        plan = planner.plan(model, [EmbeddingBagCollectionSharder()])
        seconds = time.perf_counter() - start
        n = sum(len(m) for m in plan.plan.values())
        status = "ok" if n == tables else f"planned {n} of {tables} tables"
    except Exception as exc:  # noqa: BLE001 - record any failure as data
        seconds, status = time.perf_counter() - start, f"error: {type(exc).__name__}: {exc}"
    if name == "torchrec" and seconds > cap:
        status = f"timed out (cap {cap}s, best plan so far returned)"
    out.put({"seconds": seconds, "status": status})


def in_child(target, args: tuple, limit: float) -> dict | None:
    """Run ``target(*args, queue)`` in a fresh spawned process; its row, or ``None`` when
    it gave none within ``limit`` seconds (the process is then killed)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, out))
    proc.start()
    try:
        row = out.get(timeout=limit)
    except queue.Empty:
        row = None
    proc.join(timeout=5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    return row


def timed_run(name: str, tables: int, devices: int, checkpoint: str | None, cap: int) -> dict:
    """Run one configuration of the grid in a fresh process with a hard wall-clock limit."""
    limit = cap + HARD_MARGIN + 60  # the child's imports and model build come first
    row = in_child(one_run, (name, tables, devices, checkpoint, cap), limit)
    if row is None:
        row = {"seconds": None, "status": f"killed after {limit}s wall (cap {cap}s)"}
    return {"planner": name, "tables": tables, "devices": devices, **row}


# ----------------------------------------------------------------------------------------
# --compare: DreamShardPlanner beside TorchRec's table-wise planner
# ----------------------------------------------------------------------------------------


def compared_planner(name: str, devices: int, constraints: dict):
    """A planner of the comparison (see the module docstring), built as a user would."""
    import dataclasses

    from torchrec.distributed.planner import EmbeddingShardingPlanner

    if name.startswith("dreamshard"):
        from torchrec_dreamshard.planner import DreamShardPlanner

        calibrate = {"calibrate": False} if name.endswith("-nocal") else {}
        return DreamShardPlanner(
            topology=topology(devices), batch_size=LOCAL_BATCH, constraints=constraints, **calibrate
        )
    kernels = {"compute_kernels": ["fused"]} if name.endswith("-fused") else {}
    table_wise = {
        table: dataclasses.replace(c, sharding_types=["table_wise"], **kernels)
        for table, c in constraints.items()
    }
    return EmbeddingShardingPlanner(
        topology=topology(devices), batch_size=LOCAL_BATCH, constraints=table_wise
    )


def import_package_from(tree: str) -> None:
    """Import ``torchrec_dreamshard`` from the checkout ``tree`` before anything imports
    it: every later import of its modules then resolves inside that package."""
    spec = importlib.machinery.PathFinder.find_spec("torchrec_dreamshard", [tree])
    if spec is None or spec.loader is None:
        raise ValueError(f"--baseline-tree {tree!r} holds no torchrec_dreamshard package")
    package = importlib.util.module_from_spec(spec)
    sys.modules["torchrec_dreamshard"] = package
    spec.loader.exec_module(package)


def compare_run(name: str, tables: int, devices: int, tree: str | None, out) -> None:
    """Child process: one comparison run (``tree``: the checkout whose package plans)."""
    if tree is not None:
        import_package_from(tree)
    import torch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    model, constraints = build(tables)
    planner = compared_planner(name.removesuffix(BASELINE), devices, constraints)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        plan = planner.plan(model, [EmbeddingBagCollectionSharder()])
        status = _planned(plan, tables)
    except Exception as exc:  # noqa: BLE001 - record any failure as data
        status = f"error: {type(exc).__name__}: {exc}"
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    row = {"wall_s": wall, "cpu_s": cpu, "status": status}
    if hasattr(planner, "adaptation"):
        row["adaptation"] = planner.adaptation
    out.put(row)


def _planned(plan, tables: int) -> str:
    n = sum(len(m) for m in plan.plan.values())
    return "ok" if n == tables else f"planned {n} of {tables} tables"


def compare(args: argparse.Namespace) -> list[dict]:
    """Every compared planner ``args.repeats`` times on each size, in rounds whose order
    rotates, each run in a fresh process; the raw rows."""
    names = list(args.compared)
    if args.baseline_tree:
        names += [f"{n}{BASELINE}" for n in names if n.startswith("dreamshard")]
    rows = []
    for tables in args.tables:
        for devices in args.devices:
            for r in range(args.repeats):
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    tree = args.baseline_tree if name.endswith(BASELINE) else None
                    row = in_child(compare_run, (name, tables, devices, tree), COMPARE_LIMIT_S)
                    row = row or {"wall_s": None, "cpu_s": None, "status": "killed"}
                    rows.append(
                        {"planner": name, "tables": tables, "devices": devices, "round": r, **row}
                    )
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Per size and planner: the median wall and CPU seconds of the runs that planned, with
    their min and max, the median wall over TorchRec's table-wise fused planner's, and the
    ratio to it round by round (:func:`_paired`)."""
    out = []
    for tables, devices in sorted({(r["tables"], r["devices"]) for r in rows}):
        here = [r for r in rows if (r["tables"], r["devices"]) == (tables, devices)]
        medians = {}
        for name in dict.fromkeys(r["planner"] for r in here):
            ok = [r for r in here if r["planner"] == name and r["status"] == "ok"]
            walls, cpus = [r["wall_s"] for r in ok], [r["cpu_s"] for r in ok]
            entry = {"planner": name, "tables": tables, "devices": devices, "runs": len(ok)}
            entry["failed"] = sum(r["planner"] == name for r in here) - len(ok)
            if ok:
                entry.update(_spread("wall", walls) | _spread("cpu", cpus))
                medians[name] = entry["wall_median_s"]
            out.append(entry)
        for entry in out[-len(medians) :]:
            if REFERENCE in medians and "wall_median_s" in entry:
                entry["vs_table_wise_fused"] = entry["wall_median_s"] / medians[REFERENCE]
                entry |= _paired(here, entry["planner"])
    return out


def _paired(runs: list[dict], name: str) -> dict:
    """Planner ``name``'s wall and CPU seconds over TorchRec's table-wise fused planner's in
    the same round, median [min, max] over the rounds both planned in."""
    ok = [r for r in runs if r["status"] == "ok"]
    by_round = {(r["round"], r["planner"]): r for r in ok}
    pairs = [(r, by_round[(r["round"], REFERENCE)]) for r in ok if r["planner"] == name]
    pairs = [(r, ref) for r, ref in pairs if (r["round"], REFERENCE) in by_round]
    out = {}
    for kind in ("wall", "cpu"):
        ratios = [r[f"{kind}_s"] / ref[f"{kind}_s"] for r, ref in pairs]
        out[f"paired_{kind}_ratio"] = [statistics.median(ratios), min(ratios), max(ratios)]
    return out


def _spread(kind: str, values: list[float]) -> dict:
    return {
        f"{kind}_median_s": statistics.median(values),
        f"{kind}_min_s": min(values),
        f"{kind}_max_s": max(values),
    }


def host() -> dict[str, Any]:
    """What the figures were taken on and with."""
    import torch
    import torchrec

    from harness.results_files import git

    return {
        "cpu": cpu_model(),
        "cpus": mp.cpu_count(),
        "load_average": os.getloadavg(),
        "torch": torch.__version__,
        "torchrec": torchrec.__version__,
        "commit": git("rev-parse", "HEAD"),
        # code only: a run rewrites its own results files
        "uncommitted": bool(git("status", "--porcelain", "--", *CODE)),
    }


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


# ----------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------


def results_dir() -> Path:
    from harness.results_files import RESULTS

    return RESULTS


def previous() -> dict:
    path = results_dir() / "planning_time.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def write(results: dict) -> None:
    results_dir().mkdir(parents=True, exist_ok=True)
    (results_dir() / "planning_time.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = comparison_markdown(results["comparison"]) if "comparison" in results else []
    if results.get("rows"):
        lines += grid_markdown(results["rows"], results["meta"])
    (results_dir() / "planning_time.md").write_text("\n".join(lines) + "\n")


def grid_meta(args: argparse.Namespace) -> dict:
    return {
        "machine": platform.processor() or platform.machine(),
        "cpus": mp.cpu_count(),
        "local_batch": LOCAL_BATCH,
        "hbm_cap_bytes": HBM_CAP,
        "torchrec_cap_s": args.cap,
        "checkpoint": args.checkpoint or "bundled (untrained if absent)",
        "target": "DreamShardPlanner default (safe) < 2 s for 1000 tables on 64 devices",
    }


def cell(row: dict) -> str:
    """A table cell: seconds, marking TorchRec's timeout and processes killed."""
    if row["seconds"] is None:
        return f"> {row['status'].split('after ')[1].split(' ')[0]} (killed)"
    if row["status"] == "ok":
        return f"{row['seconds']:.2f}"
    if row["status"].startswith("timed out"):
        return f"{row['seconds']:.1f} (timeout)"
    return f"{row['seconds']:.2f} ({row['status'][:40]})"


def grid_markdown(rows: list[dict], meta: dict[str, Any]) -> list[str]:
    lines = [
        "# Planning time (seconds of `planner.plan`)",
        "",
        f"CPU, {meta['cpus']} cores (shared); per-rank batch {meta['local_batch']}; "
        f"{meta['hbm_cap_bytes'] // 2**30} GB per device; DreamShard checkpoint: "
        f"{meta['checkpoint']}. Produced by `benchmarks/planning_time.py`.",
        "",
        f"TorchRec's planner runs with `timeout_seconds={meta['torchrec_cap_s']}`: "
        "'(timeout)' means it returned its best plan so far after the cap (enumeration and "
        "stats are outside its timeout, hence figures above the cap). Any run still going "
        f"{meta['torchrec_cap_s'] + HARD_MARGIN + 60} s after its process started is killed "
        "('> N (killed)', model building included).",
        "",
        "| tables | devices | " + " | ".join(PLANNERS) + " |",
        "|---:|---:|" + "---:|" * len(PLANNERS),
    ]
    cells = {(r["tables"], r["devices"], r["planner"]): cell(r) for r in rows}
    for t, d in sorted({(r["tables"], r["devices"]) for r in rows}):
        lines.append(
            f"| {t} | {d} | " + " | ".join(cells.get((t, d, p), "-") for p in PLANNERS) + " |"
        )
    return lines


def comparison_markdown(comparison: dict) -> list[str]:
    meta = comparison["meta"]
    lines = [
        "# Planning time: DreamShardPlanner beside TorchRec's table-wise planner",
        "",
        f"{meta['host']['cpu']}, {meta['host']['cpus']} cores (shared; load average "
        f"{_loads(meta)}); torch {meta['host']['torch']}, torchrec {meta['host']['torchrec']}; "
        f"commit {meta['host']['commit'][:10]}"
        + (" with uncommitted changes to the code" if meta["host"]["uncommitted"] else "")
        + (f"; `@baseline`: {meta['baseline']}" if meta.get("baseline") else "")
        + f". {meta['repeats']} runs of each planner in alternating rounds, each in a fresh "
        "process; seconds of `planner.plan` (wall, and the process's CPU time), median "
        "[min, max]; 'vs table-wise fused': the ratio of the medians, and the ratio in each "
        "round (both planners' runs of that round, one after the other), median [min, max] "
        "over the rounds. Produced by `benchmarks/planning_time.py --compare`; the planners "
        "are described in its docstring.",
        "",
        "| tables | devices | planner | wall s | CPU s | runs | wall vs table-wise fused "
        "| per round: wall | per round: CPU |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for e in comparison["summary"]:
        lines.append(_summary_row(e))
    return lines + ["", *_verdicts(comparison["summary"]), "", *_adaptations(comparison), ""]


def _summary_row(e: dict) -> str:
    head = f"| {e['tables']} | {e['devices']} | {e['planner']} |"
    if "wall_median_s" not in e:
        return f"{head} - | - | 0 ({e['failed']} failed) | - | - | - |"
    wall = f"{e['wall_median_s']:.2f} [{e['wall_min_s']:.2f}, {e['wall_max_s']:.2f}]"
    cpu = f"{e['cpu_median_s']:.2f} [{e['cpu_min_s']:.2f}, {e['cpu_max_s']:.2f}]"
    runs = f"{e['runs']}" + (f" ({e['failed']} failed)" if e["failed"] else "")
    ratio = f"{e['vs_table_wise_fused']:.2f}x" if "vs_table_wise_fused" in e else "-"
    paired = " | ".join(
        "{:.2f}x [{:.2f}, {:.2f}]".format(*e[key]) if key in e else "-"
        for key in ("paired_wall_ratio", "paired_cpu_ratio")
    )
    return f"{head} {wall} | {cpu} | {runs} | {ratio} | {paired} |"


def _verdicts(summary: list[dict]) -> list[str]:
    """The issue's bar for the default planner: under 2 s, at most 1.5x TorchRec's
    table-wise planner (the fused one, the issue's 0.95 s planner) measured beside it."""
    out = []
    for e in summary:
        if e["planner"] != "dreamshard" or "vs_table_wise_fused" not in e:
            continue
        fast, close = e["wall_median_s"] < TARGET_S, e["vs_table_wise_fused"] <= TARGET_RATIO
        out.append(
            f"- {e['tables']} tables on {e['devices']} devices: the default DreamShardPlanner "
            f"{'meets' if fast and close else 'misses'} the bar (median wall under "
            f"{TARGET_S:g} s: {'yes' if fast else 'no'}, {e['wall_median_s']:.2f} s; at most "
            f"{TARGET_RATIO}x TorchRec's table-wise fused planner: "
            f"{'yes' if close else 'no'}, {e['vs_table_wise_fused']:.2f}x; per round "
            "{:.2f}x [{:.2f}, {:.2f}] wall, {:.2f}x [{:.2f}, {:.2f}] CPU).".format(
                *e["paired_wall_ratio"], *e["paired_cpu_ratio"]
            )
        )
    return out


def _adaptations(comparison: dict) -> list[str]:
    """What the default planner's first-run check found, once per distinct answer."""
    seen = {
        json.dumps(r["adaptation"], sort_keys=True)
        for r in comparison["runs"]
        if r["planner"] == "dreamshard" and "adaptation" in r
    }
    return [f"`dreamshard`'s `planner.adaptation`: `{a}`" for a in sorted(seen)]


def _loads(meta: dict) -> str:
    before, after = meta["host"]["load_average"][0], meta["load_average_after"][0]
    return f"{before:.1f} before, {after:.1f} after"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--compare", action="store_true", help="the table-wise comparison")
    p.add_argument("--tables", type=int, nargs="+", default=None)
    p.add_argument("--devices", type=int, nargs="+", default=None)
    p.add_argument("--planners", nargs="+", default=list(PLANNERS), choices=PLANNERS)
    p.add_argument("--compared", nargs="+", default=list(COMPARED), choices=COMPARED)
    p.add_argument("--repeats", type=int, default=7, help="runs of each compared planner")
    p.add_argument("--baseline-tree", default=None, help="a checkout to time beside this one")
    p.add_argument("--baseline-note", default="", help="what the baseline checkout holds")
    p.add_argument("--cap", type=int, default=CAP_S, help="TorchRec planner timeout (s)")
    p.add_argument("--checkpoint", default=None)
    p.add_argument(
        "--merge", action="store_true", help="keep the grid rows of other runs in the file"
    )
    args = p.parse_args()
    results = previous()
    if args.compare:
        run_comparison(args, results)
    else:
        run_grid(args, results)


def run_comparison(args: argparse.Namespace, results: dict) -> None:
    from harness.results_files import git

    args.tables, args.devices = args.tables or [1000], args.devices or [64]
    meta = {"host": host(), "repeats": args.repeats, "local_batch": LOCAL_BATCH}
    if args.baseline_tree:
        tree = Path(args.baseline_tree).resolve()
        commit = git("-C", str(tree), "rev-parse", "HEAD") or "no git"
        note = f": {args.baseline_note}" if args.baseline_note else ""
        meta["baseline"] = f"{tree} ({commit[:10]}{note})"
    rows = compare(args)
    meta["load_average_after"] = os.getloadavg()
    results["comparison"] = {"meta": meta, "runs": rows, "summary": summarize(rows)}
    write(results)
    print("\n".join(comparison_markdown(results["comparison"])))


def run_grid(args: argparse.Namespace, results: dict) -> None:
    args.tables, args.devices = args.tables or list(TABLES), args.devices or list(DEVICES)
    rows = results.get("rows", []) if args.merge else []
    results["meta"] = grid_meta(args)
    for t in args.tables:
        for d in args.devices:
            for name in args.planners:
                row = timed_run(name, t, d, args.checkpoint, args.cap)
                key = (name, t, d)
                rows = [r for r in rows if (r["planner"], r["tables"], r["devices"]) != key]
                rows.append(row)
                print(json.dumps(row), flush=True)
                results["rows"] = rows
                write(results)


if __name__ == "__main__":
    main()
