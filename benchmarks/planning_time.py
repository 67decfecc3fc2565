"""Planning time: DreamShardPlanner (safe, the default; greedy; search) against TorchRec's
default planner.

Every run plans the same meta-device model: an ``EmbeddingBagCollection`` of T tables drawn
from the synthetic DLRM-shaped pool (full scale, ``synthetic_pool(num_tables=T)``) with
their pooling factors as ``ParameterConstraints``, on D CUDA devices of 80 GB (planning
needs no GPU), per-rank batch 512. Each run is a fresh process; the figure is the wall time
of ``planner.plan(model, sharders)`` alone (imports and checkpoint loading excluded).
TorchRec's planner is given ``timeout_seconds=CAP`` and its process is killed at
``CAP + HARD_MARGIN`` seconds (its enumeration is not covered by its own timeout).

    .venv/bin/python benchmarks/planning_time.py            # the full grid
    .venv/bin/python benchmarks/planning_time.py --tables 50 200 --devices 8 --cap 30

Writes ``benchmarks/results/planning_time.json`` (raw rows) and ``.md`` (a table).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import queue
import time
import warnings
from typing import Any

from _paths import RESULTS

TABLES = (50, 200, 1000, 2000)
DEVICES = (8, 64, 128)
LOCAL_BATCH = 512
HBM_CAP = 80 * 2**30  # bytes per device
CAP_S = 120  # TorchRec planner timeout, seconds
HARD_MARGIN = 60  # seconds past the cap before the process is killed
PLANNERS = ("dreamshard-safe", "dreamshard-greedy", "dreamshard-search", "torchrec")


def build(num_tables: int):
    """The meta-device model and its constraints."""
    import torch
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from torchrec_dreamshard.data.pool import synthetic_pool

    pool = synthetic_pool(num_tables=num_tables, seed=0)
    configs = [
        EmbeddingBagConfig(
            name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[f"f_{t.name}"]
        )
        for t in pool
    ]
    constraints = {t.name: ParameterConstraints(pooling_factors=[t.pooling_factor]) for t in pool}
    return EmbeddingBagCollection(tables=configs, device=torch.device("meta")), constraints


def make_planner(name: str, devices: int, constraints: dict, checkpoint: str | None, cap: int):
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import Topology

    topology = Topology(world_size=devices, compute_device="cuda", hbm_cap=HBM_CAP)
    if name == "torchrec":
        return EmbeddingShardingPlanner(
            topology=topology, batch_size=LOCAL_BATCH, constraints=constraints,
            timeout_seconds=cap,
        )  # fmt: skip
    from torchrec_dreamshard.planner import DreamShardPlanner

    agent = load_agent(checkpoint)
    mode = name.split("-")[1]
    return DreamShardPlanner(
        topology=topology, batch_size=LOCAL_BATCH, constraints=constraints, agent=agent,
        mode=mode,
    )  # fmt: skip


def load_agent(checkpoint: str | None):
    """The given checkpoint, else the bundled one, else an untrained agent (same speed)."""
    from torchrec_dreamshard.planner.candidates import default_sources
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


def timed_run(name: str, tables: int, devices: int, checkpoint: str | None, cap: int) -> dict:
    """Run one configuration in a fresh process with a hard wall-clock limit."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=one_run, args=(name, tables, devices, checkpoint, cap, out))
    proc.start()
    limit = cap + HARD_MARGIN + 60  # the child's imports and model build come first
    try:
        row = out.get(timeout=limit)
    except queue.Empty:
        row = {"seconds": None, "status": f"killed after {limit}s wall (cap {cap}s)"}
    proc.join(timeout=5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    return {"planner": name, "tables": tables, "devices": devices, **row}


def write(rows: list[dict], args: argparse.Namespace) -> None:
    meta = {
        "machine": platform.processor() or platform.machine(),
        "cpus": mp.cpu_count(),
        "local_batch": LOCAL_BATCH,
        "hbm_cap_bytes": HBM_CAP,
        "torchrec_cap_s": args.cap,
        "checkpoint": args.checkpoint or "bundled (untrained if absent)",
        "target": "DreamShardPlanner default (safe) < 2 s for 1000 tables on 64 devices",
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "planning_time.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (RESULTS / "planning_time.md").write_text(markdown(rows, meta))


def cell(row: dict) -> str:
    """A table cell: seconds, marking TorchRec's timeout and processes killed."""
    if row["seconds"] is None:
        return f"> {row['status'].split('after ')[1].split(' ')[0]} (killed)"
    if row["status"] == "ok":
        return f"{row['seconds']:.2f}"
    if row["status"].startswith("timed out"):
        return f"{row['seconds']:.1f} (timeout)"
    return f"{row['seconds']:.2f} ({row['status'][:40]})"


def markdown(rows: list[dict], meta: dict[str, Any]) -> str:
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
    return "\n".join(lines) + "\n"


def previous_rows() -> list[dict]:
    path = RESULTS / "planning_time.json"
    return json.loads(path.read_text())["rows"] if path.is_file() else []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tables", type=int, nargs="+", default=list(TABLES))
    p.add_argument("--devices", type=int, nargs="+", default=list(DEVICES))
    p.add_argument("--planners", nargs="+", default=list(PLANNERS), choices=PLANNERS)
    p.add_argument("--cap", type=int, default=CAP_S, help="TorchRec planner timeout (s)")
    p.add_argument("--checkpoint", default=None)
    p.add_argument(
        "--merge", action="store_true", help="keep the rows of other runs in the results file"
    )
    args = p.parse_args()
    rows = previous_rows() if args.merge else []
    for t in args.tables:
        for d in args.devices:
            for name in args.planners:
                row = timed_run(name, t, d, args.checkpoint, args.cap)
                rows = [r for r in rows if (r["planner"], r["tables"], r["devices"]) != (
                    name, t, d)] + [row]  # fmt: skip
                print(json.dumps(row), flush=True)
                write(rows, args)


if __name__ == "__main__":
    main()
