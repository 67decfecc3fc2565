"""At scale, every sharding type allowed: DreamShardPlanner against TorchRec's planner,
both plans measured the same way.

The model is production-shaped (an ``EmbeddingBagCollection`` on the meta device: tables
of 1e3-5e7 rows, log-uniform, dims 16-256 in powers of two, pooling factor 1), on a CUDA
topology of 80 GB devices, per-rank batch 8192, ``get_default_sharders()``, no constraints.
Planned by:

- **ours**: the default ``DreamShardPlanner`` (the type choice on);
- **ours, table-wise**: the same, every table constrained to ``table_wise`` (so the type
  choice's own gain shows);
- **TorchRec**: ``EmbeddingShardingPlanner``, in a subprocess stopped at ``--cap`` seconds
  (reported so). Where it is stopped, ``--torchrec-plan FILE`` scores a plan TorchRec
  made in a longer run (its time is in that file).

Each plan is scored the same way: every device's kernels are measured in turn on this
CPU (FBGEMM's fused kernels with row-wise Adagrad: the table-wise and column-wise shards
at the global batch, the row-wise and table-row-wise shards on their share of the ids at
the global batch, the data-parallel tables at the local batch plus their dense passes
charged analytically at the device's HBM bandwidth). Rows are scaled by one factor, the
same for every plan, so that the fullest device of any plan fits ``--device-gb``; the
batch is scaled by the same factor (``--batch-div``: CPU kernels at a million bags per
table would take hours for 128 devices), so that every byte count (gathers, all-to-alls,
all-reduces, dense passes) scales alike; the collectives are priced for that scaled
model by the hierarchical models the planner prices with (within a host at TorchRec's intra-host
bandwidth, across hosts at its inter-host bandwidth: analytic, unmeasured). Reported per
plan: planning time, types, the slowest device's measured compute and the step with
modelled collectives (the slowest device's compute plus its collectives): each device's
figure is its minimum over the rounds (the package's rule; the plans' devices are
measured interleaved, round by round), and the range is that of each round's slowest.

Raw results: ``results/at_scale.json``; report: ``results/at_scale.md``.

Usage: python benchmarks/at_scale.py [--tables 1000] [--devices 128] [--local 8]
    [--cap 600] [--rounds 3] [--torchrec-plan FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

from harness.results_files import machine, write

HERE = Path(__file__).resolve().parent

LOCAL_BATCH = 8192
HBM_CAP = 80 * 2**30  # bytes per GPU
DIMS = (16, 32, 64, 128, 256)
ROWS = (1e3, 5e7)


def table_shapes(tables: int, seed: int = 0) -> list[tuple[str, int, int]]:
    """``(name, rows, dim)`` of every table (see the module docstring)."""
    rng = np.random.default_rng(seed)
    rows = np.exp(rng.uniform(np.log(ROWS[0]), np.log(ROWS[1]), tables)).astype(int)
    dims = rng.choice(DIMS, tables)
    return [(f"t{i}", int(r), int(d)) for i, (r, d) in enumerate(zip(rows, dims, strict=True))]


def build(tables: int, seed: int = 0):
    """The model (its ``ebc`` holds the tables), on the meta device."""
    import torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    configs = [
        EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=r, feature_names=[f"f_{n}"])
        for n, r, d in table_shapes(tables, seed)
    ]

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))

    return Model()


def topology(devices: int, local: int):
    """TorchRec's CUDA topology of ``devices`` 80 GB GPUs, ``local`` per host."""
    from torchrec.distributed.planner.types import Topology

    return Topology(
        world_size=devices, local_world_size=local, compute_device="cuda", hbm_cap=HBM_CAP
    )


def plan_entries(plan) -> dict[str, dict]:
    """A ``ShardingPlan``'s ``ebc`` as plain JSON: per table its type, kernel, ranks and
    shards ``[row offset, col offset, rows, cols, rank]`` (data-parallel: no shards)."""
    out = {}
    for name, ps in plan.plan["ebc"].items():
        shards = []
        if ps.sharding_spec is not None:
            for s in ps.sharding_spec.shards:
                shards.append([*s.shard_offsets, *s.shard_sizes, s.placement.rank()])
        out[name] = {
            "type": ps.sharding_type,
            "kernel": ps.compute_kernel,
            "ranks": list(ps.ranks or []),
            "shards": shards,
        }
    return out


def plan_with_torchrec(tables: int, devices: int, local: int, cap_s: int) -> dict:
    """TorchRec's ``EmbeddingShardingPlanner`` on the model: its time, types and plan."""
    import logging

    import torch
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.sharding_plan import get_default_sharders

    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    model = build(tables)
    planner = EmbeddingShardingPlanner(
        topology(devices, local), LOCAL_BATCH, debug=False, timeout_seconds=cap_s
    )
    start = time.perf_counter()
    plan = planner.plan(model, get_default_sharders())
    seconds = time.perf_counter() - start
    entries = plan_entries(plan)
    types = Counter(e["type"] for e in entries.values())
    return {"seconds": seconds, "types": dict(types), "plan": entries}


def plan_ours(args, table_wise_only: bool) -> dict:
    """Our planner's plan (every table held to table-wise where asked), timed."""
    import torch
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.sharding_plan import get_default_sharders

    from torchrec_dreamshard.planner import DreamShardPlanner

    torch.set_num_threads(1)
    constraints = None
    if table_wise_only:
        constraints = {
            n: ParameterConstraints(sharding_types=["table_wise"])
            for n, _, _ in table_shapes(args.tables)
        }
    planner = DreamShardPlanner(
        topology(args.devices, args.local), LOCAL_BATCH, constraints=constraints, debug=False
    )
    start, cpu = time.perf_counter(), time.process_time()
    plan = planner.plan(build(args.tables), get_default_sharders())
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    entries = plan_entries(plan)
    chosen = planner.proposer.last_types
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "types": dict(Counter(e["type"] for e in entries.values())),
        "plan": entries,
        "type_choice": chosen.lines() if chosen else None,
        "type_plan": chosen.to_dict() if chosen else None,
    }


def plan_torchrec(args) -> dict:
    """TorchRec's planner in a subprocess, stopped at ``args.cap`` seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--torchrec-worker"]
        cmd += [str(args.tables), str(args.devices), str(args.local), str(out), str(args.cap)]
        start = time.perf_counter()
        try:
            subprocess.run(cmd, check=True, timeout=args.cap, capture_output=True)
        except subprocess.TimeoutExpired:
            return {"seconds": time.perf_counter() - start, "stopped": True}
        result = json.loads(out.read_text())
    return result | {"stopped": False}


def device_kernels(plan: dict, shapes: dict, devices: int, local: int, scale: float):
    """Per device: ``(global-batch tables, local-batch tables, dense-pass bytes)``, rows
    scaled by ``scale`` (:class:`TableSpec` s, pooling factor 1)."""
    from torchrec_dreamshard.data.tables import TableSpec

    glob = [[] for _ in range(devices)]
    loc = [[] for _ in range(devices)]
    dense = np.zeros(devices)

    def spec(name, rows, dim, pooling=1.0):
        return TableSpec(
            name=name, rows=max(1, round(rows * scale)), dim=int(dim), pooling_factor=pooling
        )

    for name, e in plan.items():
        rows, dim = shapes[name]
        if e["type"] == "data_parallel":
            for d in range(devices):
                loc[d].append(spec(name, rows, dim))
            dense += 4.0 * rows * dim * 4 * scale  # grad zeroing, read, weights read+write
            continue
        row_split = e["type"] in ("row_wise", "table_row_wise", "grid_shard")
        for k, (_, _, srows, scols, rank) in enumerate(e["shards"]):
            share = srows / rows if row_split else 1.0
            glob[rank].append(spec(f"{name}/{k}", srows, scols, share))
    return glob, loc, dense


def measure_device(kernels, d: int, args) -> float:
    """Device ``d``'s measured compute ms (one round: the median of ``iters``)."""
    from torchrec_dreamshard.measure.config import MeasureConfig
    from torchrec_dreamshard.measure.local import time_groups

    config = MeasureConfig(rounds=1, warmup=1, iters=3)
    batch = LOCAL_BATCH * args.devices // args.batch_div
    glob, loc, dense, hbm_bw = kernels
    ms = dense[d] / hbm_bw
    if glob[d]:
        ms += float(time_groups([glob[d]], batch, config)[0, 0].sum())
    if loc[d]:
        ms += float(time_groups([loc[d]], max(1, batch // args.devices), config)[0, 0].sum())
    return ms


def measure_plans(rows: dict, shapes: dict, args, scale: float, hbm_bw: float) -> dict:
    """``[rounds, devices]`` measured compute ms per plan: in each round every plan's
    devices in turn, the plans interleaved, so that the shared machine's slow moments
    fall on every plan."""
    kernels = {
        name: (*device_kernels(row["plan"], shapes, args.devices, args.local, scale), hbm_bw)
        for name, row in rows.items()
    }
    out = {name: np.zeros((args.rounds, args.devices)) for name in rows}
    for r in range(args.rounds):
        for name in rows:
            for d in range(args.devices):
                out[name][r, d] = measure_device(kernels[name], d, args)
            print(f"round {r}: {name} measured", flush=True)
    return out


def modelled_comm(plan: dict, shapes: dict, args) -> np.ndarray:
    """``[devices]`` ms of every collective each device joins, by the hierarchical models
    the planner prices with, for the model as measured: rows scaled by ``args.row_scale``,
    the batch divided by ``args.batch_div`` (so data-parallel's all-reduce of the scaled
    tables' bytes stands to the all-to-alls of the scaled batch as at full scale)."""
    from torchrec_dreamshard.cost.comm_topology import CommTopology, analytic_models
    from torchrec_dreamshard.cost.plans import plan_breakdown
    from torchrec_dreamshard.cost.sharding import CostContext, TableChoice
    from torchrec_dreamshard.cost.sharding_types import BY_TORCHREC_TYPE
    from torchrec_dreamshard.data.tables import TableSpec

    topo = CommTopology.from_torchrec(topology(args.devices, args.local))
    ctx = CostContext(
        batch_size=LOCAL_BATCH * args.devices // args.batch_div,
        topology=topo,
        collectives=analytic_models(topo),
        kernel_ms=lambda tables, batch: (0.0, 0.0),
    )
    choices = []
    for name, e in plan.items():
        rows, dim = shapes[name]
        strategy = BY_TORCHREC_TYPE[e["type"]]
        ranks = strategy.option_ranks([s[-1] for s in e["shards"]])
        if strategy.name == "table_row_wise":
            ranks = tuple(sorted(ranks))
        scaled = max(1, round(rows * args.row_scale))  # as the measured kernels' tables
        table = TableSpec(name=name, rows=scaled, dim=dim, pooling_factor=1.0)
        choices.append(TableChoice(table=table, sharding_type=strategy.name, ranks=ranks))
    br = plan_breakdown(choices, ctx)
    return sum(br.comm_ms.values(), np.zeros(args.devices))


def row_scale(plans: list[dict], shapes: dict, args) -> float:
    """The one row factor that fits the fullest device of any plan into ``--device-gb``."""
    fullest = 0.0
    for plan in plans:
        load = np.zeros(args.devices)
        for name, e in plan.items():
            rows, dim = shapes[name]
            if e["type"] == "data_parallel":
                load += rows * dim * 4
            for _, _, srows, scols, rank in e["shards"]:
                load[rank] += srows * scols * 4
        fullest = max(fullest, float(load.max()))
    return min(1.0, args.device_gb * 1e9 / fullest)


def score(row: dict, compute: np.ndarray, shapes: dict, args) -> None:
    """Add ``row``'s measured compute (``[rounds, devices]``), collectives and step to it:
    the figures are each device's minimum over the rounds (the package's rule), then the
    slowest device; the range is the slowest device's of each round."""
    comm = modelled_comm(row["plan"], shapes, args)
    best = compute.min(axis=0)
    row["device_compute_ms"] = compute.tolist()  # [rounds][devices], raw
    row["device_comm_ms"] = comm.tolist()
    row["compute_ms"] = {"figure": float(best.max()), "rounds": compute.max(axis=1).tolist()}
    row["step_ms"] = {
        "figure": float((best + comm).max()),
        "rounds": (compute + comm[None, :]).max(axis=1).tolist(),
    }
    row["slowest_device"] = int(np.argmax(best))
    row["slowest_step_device"] = int(np.argmax(best + comm))
    row["comm_ms_max"] = float(comm.max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=1000)
    ap.add_argument("--devices", type=int, default=128)
    ap.add_argument("--local", type=int, default=8, help="GPUs per host")
    ap.add_argument("--cap", type=int, default=600, help="TorchRec planner stop (s)")
    ap.add_argument("--torchrec-plan", help="a TorchRec plan from a longer run, to score")
    ap.add_argument("--wait", type=int, default=1800, help="s to wait for --torchrec-plan")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--batch-div", type=int, default=0, help="default: 1 / the row scale (bytes alike)"
    )
    ap.add_argument("--plans", help="an earlier raw file: score its plans, plan nothing")
    ap.add_argument("--device-gb", type=float, default=0.5)
    ap.add_argument("--name", default="at_scale")
    ap.add_argument(
        "--plan-only",
        action="store_true",
        help="time our planner (every type, and held to table-wise) and measure nothing",
    )
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.WARNING)
    from torchrec_dreamshard.cost.sharding_types.data_parallel import DENSE_UPDATE_PASSES

    assert DENSE_UPDATE_PASSES == 4.0  # device_kernels charges four passes
    if args.plan_only:
        times = plan_times(args)
        lines = [
            f"# Our planner on {args.tables} tables, {args.devices} GPUs ({args.local} a host)"
        ]
        lines += [
            f"- {name}: {row['seconds']:.1f} s wall, {row['cpu_seconds']:.1f} s CPU, {row['types']}"
            for name, row in times["planners"].items()
        ]
        write(args.name, {"machine": machine(), "settings": vars(args)} | times, "\n".join(lines))
        return
    if args.plans:
        rows = json.loads(Path(args.plans).read_text())["planners"]
        for row in rows.values():
            for key in ("compute_ms", "step_ms", "device_compute_ms", "device_comm_ms"):
                row.pop(key, None)
    else:
        rows = plan_all(args)
    shapes = {n: (r, d) for n, r, d in table_shapes(args.tables)}
    scored = {k: v for k, v in rows.items() if "plan" in v}
    args.row_scale = row_scale([v["plan"] for v in scored.values()], shapes, args)
    args.batch_div = args.batch_div or round(1 / args.row_scale)
    hbm_bw = float(topology(args.devices, args.local).hbm_mem_bw)
    measured = measure_plans(scored, shapes, args, args.row_scale, hbm_bw)
    for name, row in scored.items():
        score(row, measured[name], shapes, args)
        print(name, row["compute_ms"], row["step_ms"], flush=True)
    settings = vars(args) | {"local_batch": LOCAL_BATCH}
    out = {"machine": machine(), "settings": settings, "planners": rows}
    write(args.name, out, report(out))


def plan_times(args) -> dict:
    """Our planner's wall and CPU seconds on the model, every type allowed and held to
    table-wise (the plans' types; nothing measured)."""
    rows = {}
    for name, table_wise in (("dreamshard", False), ("dreamshard_table_wise", True)):
        row = plan_ours(args, table_wise)
        rows[name] = {k: row[k] for k in ("seconds", "cpu_seconds", "types")}
        print(name, f"{row['seconds']:.1f} s wall, {row['cpu_seconds']:.1f} s CPU", row["types"])
    return {"planners": rows}


def plan_all(args) -> dict:
    """Every planner's plan and time (TorchRec's from a longer run where it is stopped)."""
    rows = {"dreamshard": plan_ours(args, False), "dreamshard_table_wise": plan_ours(args, True)}
    for name, row in rows.items():
        print(name, f"{row['seconds']:.1f} s", row["types"], flush=True)
    rows["torchrec"] = plan_torchrec(args)
    print("torchrec", rows["torchrec"].get("seconds"), rows["torchrec"].get("types"), flush=True)
    if rows["torchrec"]["stopped"] and args.torchrec_plan:
        waited = time.perf_counter()
        while not Path(args.torchrec_plan).exists():
            if time.perf_counter() - waited > args.wait:
                raise SystemExit(f"no TorchRec plan in {args.torchrec_plan} after {args.wait} s")
            time.sleep(10)
        longer = json.loads(Path(args.torchrec_plan).read_text())
        rows["torchrec_longer_run"] = longer | {"stopped": False, "file": args.torchrec_plan}
    return rows


def report(out: dict) -> str:
    s, rows = out["settings"], out["planners"]
    lines = [
        "# At scale, every sharding type allowed, both plans measured",
        "",
        f"{s['tables']} tables (1e3-5e7 rows log-uniform, dims 16-256, pooling 1) on "
        f"{s['devices']} GPUs, {s['local']} per host, per-rank batch {s['local_batch']}, "
        "`get_default_sharders()`, no constraints. Scored alike: each device's kernels "
        f"measured in turn on this CPU ({s['rounds']} rounds; rows x{s['row_scale']:.4g}, "
        f"batch / {s['batch_div']}: every byte count scaled alike), collectives by the "
        "hierarchical models for that scaled model (analytic). The machine was shared with "
        "other jobs: timings are noisy.",
        "",
        "| planner | planning s (cpu s) | sharding types | slowest device's compute ms "
        "(rounds' range) | step with modelled collectives ms (range) |",
        "|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        types = ", ".join(f"{n} {t}" for t, n in sorted(row.get("types", {}).items()))
        when = f"{row['seconds']:.1f}" + (" (stopped)" if row.get("stopped") else "")
        if "cpu_seconds" in row:
            when += f" ({row['cpu_seconds']:.1f})"
        cells = ["-", "-"]
        if "compute_ms" in row:
            cells = [
                f"{row[k]['figure']:.1f} ({min(row[k]['rounds']):.1f}-{max(row[k]['rounds']):.1f})"
                for k in ("compute_ms", "step_ms")
            ]
        lines.append(f"| {name} | {when} | {types or '-'} | {cells[0]} | {cells[1]} |")
    lines += ["", *ratio_lines(rows), "", *(rows["dreamshard"].get("type_choice") or [])]
    return "\n".join(lines + ["", out["machine"]["note"]]) + "\n"


def ratio_lines(rows: dict) -> list[str]:
    """Ours over each other plan, per round (median and range)."""
    out = []
    ours = rows["dreamshard"]
    for name, row in rows.items():
        if name == "dreamshard" or "compute_ms" not in row:
            continue
        for what in ("step_ms", "compute_ms"):
            r = np.array(ours[what]["rounds"]) / np.array(row[what]["rounds"])
            out.append(
                f"- ours / {name}, {what[:-3]}: {ours[what]['figure'] / row[what]['figure']:.3f}"
                f" (per round {r.min():.3f}-{r.max():.3f})"
            )
    return out


def torchrec_worker(argv: list[str]) -> None:
    """The subprocess: ``--torchrec-worker TABLES DEVICES LOCAL OUT.json CAP_S``."""
    warnings.simplefilter("ignore")
    t, d, loc, out, cap = argv
    result = plan_with_torchrec(int(t), int(d), int(loc), cap_s=int(cap))
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--torchrec-worker"]:
        torchrec_worker(sys.argv[2:])
    else:
        main()
