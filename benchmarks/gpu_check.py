"""One command that proves the planner on a GPU, in two parts.

``prepare`` (needs the full stack, TorchRec included; runs anywhere) writes the tasks and
the plans that need TorchRec, as plain JSON: the demo's model, one task of each held-out
family, and one task of a few hundred tables; with each, TorchRec's planner's plan on a
CUDA topology (no GPU is needed to plan for one) and every classic heuristic's plan.

``run`` (needs torch and FBGEMM only, **no TorchRec**) on the machine to check:

1. times the reference kernel;
2. calibrates the cost network on this device's kernels within the budget (tables drawn
   from every task, singly and in the fused groups the planner would weigh);
3. plans every task with the policy (the calibrated agent, and the checkpoint as it is);
4. measures every plan (ours, the checkpoint's, TorchRec's, the heuristics') on the
   device in interleaved rounds, each simulated device's fused kernel timed in turn on
   the one device (the local backend); the all-to-all is charged from a model (on CUDA,
   TorchRec's intra-host bandwidth, unmeasured: one GPU has no peer);
5. writes ``results.json`` (device model, versions, the cost network's error before and
   after calibration, each plan's measured step against TorchRec's plan and the best
   heuristic's) and the profile it learned (``profile.pt``, a ``MachineProfile`` the
   planner plans from with ``profile=``, and ``profile.json``, its summary).

A measurement that fails (a CUDA error, an out-of-memory, an FBGEMM operator missing from
the build) is recorded in the results and the run goes on without it.

    python benchmarks/gpu_check.py prepare --out gpu_tasks             # anywhere
    python benchmarks/gpu_check.py run --in gpu_tasks --out gpu_out    # on the GPU
    python benchmarks/gpu_check.py prepare --out t --small && \\
        python benchmarks/gpu_check.py run --in t --out o --device cpu --budget-s 20

``run`` fits 5 minutes on one H100-class GPU with the defaults (``--budget-s 180``: the
seconds of measuring, calibration included; start-up and planning come on top).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "gpu_check/1"
CALIBRATION_SHARE = 0.4  # of the budget, for calibrating; the rest measures the plans
CALIBRATION_TABLES = 160  # tables drawn from every task for the calibration kernels
SMALL_ROWS = 20_000  # --small: rows of a table at most (CPU-sized kernels for CI)
_START = time.perf_counter()


def say(message: str) -> None:
    """A progress line, with the seconds since start."""
    print(f"[{time.perf_counter() - _START:7.1f}s] {message}", flush=True)


# ----------------------------------------------------------------------------------------
# prepare (TorchRec)
# ----------------------------------------------------------------------------------------


def draw_tasks(small: bool, seed: int) -> list[tuple[str, str, Any]]:
    """``[(name, kind, task)]``: the demo's model, one task per held-out family and one
    task of a few hundred tables (``small``: a dozen to a few dozen small tables each)."""
    from torchrec_dreamshard.cli.demo import demo_task
    from torchrec_dreamshard.data.families import HELDOUT_FAMILIES, draw_task

    from harness.task_draws import bench_task

    out = []
    if small:
        out.append(("demo", "demo model", demo_task(seed, 12, 2, 2048)))
        fam = HELDOUT_FAMILIES[0]
        out.append((fam, "held-out family", draw_task(fam, "test", seed, (12, 12), [2])))
        out.append(("large", "many tables", bench_task(40, 4, 2048, seed)))
        return [(n, k, shrink(t)) for n, k, t in out]
    out.append(("demo", "demo model", demo_task(seed, 60, 4, 2048)))
    out += [(f, "held-out family", draw_task(f, "test", seed)) for f in HELDOUT_FAMILIES]
    out.append(("large", "many tables", bench_task(300, 16, 2048, seed)))
    return out


def shrink(task: Any) -> Any:
    """``task`` with every table cut to :data:`SMALL_ROWS` rows at most, each device's
    memory cut in the same proportion as the tables' bytes."""
    from torchrec_dreamshard.data.tasks import Task

    tables = [dataclasses.replace(t, rows=min(t.rows, SMALL_ROWS)) for t in task.tables]
    ratio = sum(t.size_bytes for t in tables) / task.total_bytes
    memory = [max(1, int(m * ratio)) for m in task.memory]
    return Task(
        tables=tables, num_devices=task.num_devices, memory_bytes=memory, batch_size=task.batch_size
    )


def torchrec_plan(task: Any) -> tuple[list[int] | None, str]:
    """TorchRec's planner's plan of ``task`` on a CUDA topology (table-wise), and how its
    memory was counted: TorchRec's estimate with nothing reserved (the task's memory is
    what the job leaves each GPU), else weights only; ``None`` where it found none."""
    from torchrec_dreamshard.data.tasks import NoPlanError
    from torchrec_dreamshard.planner.stages.candidates import torchrec_placement

    for accounting in ("unreserved", "weights"):
        try:
            return torchrec_placement(
                task, accounting=accounting, compute_device="cuda"
            ), accounting
        except NoPlanError:
            continue
    return None, "no plan"


def prepare(args: argparse.Namespace) -> int:
    """Write ``manifest.json`` and one ``<task>.json`` per task under ``args.out``."""
    import warnings

    import torch
    import torchrec

    from torchrec_dreamshard.io import atomic_write, dumps_strict
    from torchrec_dreamshard.measure.hardware import fbgemm_version
    from torchrec_dreamshard.verification.verification import heuristic_plans
    from torchrec_dreamshard.version import __version__

    warnings.filterwarnings("ignore")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for name, kind, task in draw_tasks(args.small, args.seed):
        say(f"prepare: {name} ({kind}): {len(task.tables)} tables, {task.num_devices} devices")
        plan, accounting = torchrec_plan(task)
        record = {
            "name": name,
            "kind": kind,
            "task": task.to_dict(),
            "torchrec": plan,
            "torchrec_accounting": accounting,
            "heuristics": {h: list(p) for h, p in heuristic_plans(task).items()},
        }
        atomic_write(out / f"{name}.json", dumps_strict(record), "task file")
        names.append(name)
    manifest = {
        "format": FORMAT,
        "small": bool(args.small),
        "seed": args.seed,
        "tasks": names,
        "torchrec_topology": "cuda",
        "versions": {
            "torch": torch.__version__,
            "torchrec": getattr(torchrec, "__version__", "unknown"),
            "fbgemm_gpu": fbgemm_version(),
            "torchrec_dreamshard": __version__,
        },
    }
    atomic_write(out / "manifest.json", dumps_strict(manifest), "manifest")
    say(f"prepare: wrote {len(names)} tasks to {out}")
    return 0


# ----------------------------------------------------------------------------------------
# run (torch and FBGEMM only)
# ----------------------------------------------------------------------------------------


def load_prepared(folder: Path) -> tuple[dict, list[dict]]:
    """The manifest and the task records ``prepare`` wrote (each with its ``Task``)."""
    from torchrec_dreamshard.data.tasks import Task
    from torchrec_dreamshard.io import read_json

    manifest = read_json(folder / "manifest.json", "gpu_check manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{folder / 'manifest.json'} is not a {FORMAT} manifest (run prepare)")
    records = []
    for name in manifest["tasks"]:
        record = read_json(folder / f"{name}.json", "gpu_check task file")
        record["task"] = Task.from_dict(record["task"])
        records.append(record)
    return manifest, records


def machine(device: str) -> dict[str, Any]:
    """The device model and the versions of what measures."""
    import torch

    from torchrec_dreamshard.measure.hardware import device_name, fbgemm_version
    from torchrec_dreamshard.version import __version__

    return {
        "device": device,
        "device_model": device_name(device),
        "cpu_model": device_name("cpu"),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "fbgemm_gpu": fbgemm_version(),
            "torchrec_dreamshard": __version__,
        },
        "torch_threads": torch.get_num_threads(),
    }


def comm_models_path(device: str, out: Path) -> str | None:
    """The collective models the all-to-all is charged from: on CUDA, TorchRec's
    intra-host bandwidth written to ``out`` (analytic: one GPU has no peer to time it
    with); on CPU ``None``, this machine's gloo fit (timed once, then cached)."""
    if device != "cuda":
        return None
    from torchrec_dreamshard.cost.comm_topology import CommTopology, analytic_models
    from torchrec_dreamshard.io import atomic_write, dumps_strict

    path = out / "collectives_analytic.json"
    models = analytic_models(CommTopology(world_size=2))
    atomic_write(path, dumps_strict(models.to_dict()), "collective models file")
    return str(path)


def calibration_task(records: Sequence[dict], seed: int) -> Any:
    """Up to :data:`CALIBRATION_TABLES` tables drawn from every task (renamed by task),
    on as many devices as the largest task, at the tasks' median batch."""
    from torchrec_dreamshard.data.tasks import Task

    pool = [
        dataclasses.replace(t, name=f"{r['name']}.{t.name}")
        for r in records
        for t in r["task"].tables
    ]
    rng = np.random.default_rng(seed)
    keep = sorted(rng.permutation(len(pool))[: min(CALIBRATION_TABLES, len(pool))])
    tables = [pool[i] for i in keep]
    devices = max(r["task"].num_devices for r in records)
    batch = int(statistics.median(r["task"].batch_size for r in records))
    memory = int(2 * sum(t.size_bytes for t in tables) / devices) + 1
    return Task(tables=tables, num_devices=devices, memory_bytes=memory, batch_size=batch)


def calibrate_step(
    prior: Any, records: list[dict], config: Any, budget_s: float, out: Path, seed: int
) -> Any:
    """Step 2: the calibration (a ``CalibrationResult``; the prior where it failed)."""
    from torchrec_dreamshard.calibration import CalibrationConfig, calibrate

    task = calibration_task(records, seed)
    say(
        f"2/5 calibrating on {len(task.tables)} tables drawn from every task, "
        f"batch {task.batch_size}, within {budget_s:.0f} s"
    )
    settings = CalibrationConfig(
        budget_s=budget_s, store=out / "calibration.sqlite", measure=config, progress=False
    )
    result = calibrate(prior, task, settings)
    for line in result.lines():
        say(line)
    return result


def plans_of(record: dict, prior: Any, agent: Any) -> dict[str, list[int]]:
    """Step 3: every plan of a task by name (a placement proposed twice keeps its first
    name and gains the others': ``dreamshard=heuristic:size``)."""
    task = record["task"]
    named: dict[tuple[int, ...], str] = {}
    candidates = {
        "dreamshard": agent.place(task),
        "checkpoint": prior.place(task),
        "torchrec": record["torchrec"],
        **{f"heuristic:{h}": p for h, p in record["heuristics"].items()},
    }
    for name, plan in candidates.items():
        if plan is None:
            continue
        key = tuple(int(d) for d in plan)
        named[key] = f"{named[key]}={name}" if key in named else name
    return {name: list(p) for p, name in named.items()}


def measure_task(
    task: Any,
    plans: dict[str, list[int]],
    config: Any,
    comm: Any,
    rounds: int,
    deadline: float,
) -> tuple[list[dict], Any]:
    """Step 4: ``plans`` measured in interleaved rounds until ``rounds`` or until the next
    round would end past the ``deadline`` (at least one round); the rounds, and the
    failure that stopped them (``None``: none)."""
    from torchrec_dreamshard.measure import measure_plans
    from torchrec_dreamshard.measure.guard import MeasureFailure, guarded

    done: list[dict] = []
    took = 0.0  # seconds of the last round
    for r in range(rounds):
        if done and time.perf_counter() + took > deadline:
            break
        begin = time.perf_counter()
        got = guarded(
            f"measuring the plans, round {r + 1}",
            lambda r=r, done=done: measure_plans(
                task, plans, config, rounds=r + 1, done=done, comm=comm
            ),
            device=config.device,
        )
        if isinstance(got, MeasureFailure):
            return done, got
        done, took = got, time.perf_counter() - begin
    return done, None


def ratio(rows: dict[str, dict], mine: str, other: str | None) -> float | None:
    """``mine``'s median measured step over ``other``'s (``None``: either unmeasured)."""
    if other is None or mine not in rows or other not in rows:
        return None
    return rows[mine]["median_ms"] / rows[other]["median_ms"]


def task_result(record: dict, plans: dict, done: list[dict], agent: Any, failure: Any) -> dict:
    """What one task measured: each plan's rounds and median, and the margins."""
    task = record["task"]
    rows = {}
    for name, placement in plans.items():
        steps = [r[name].step_ms for r in done if name in r]
        row = {
            "placement": placement,
            "predicted_ms": agent.predict(task, placement).step_ms,
            "rounds_ms": steps,
        }
        if steps:
            row["median_ms"] = float(statistics.median(steps))
        rows[name] = row
    measured = {n: r for n, r in rows.items() if "median_ms" in r}
    ours = next((n for n in plans if n.split("=")[0] == "dreamshard"), None)
    torchrec = next((n for n in plans if "torchrec" in n.split("=")), None)
    heur = [n for n in measured if any(p.startswith("heuristic:") for p in n.split("="))]
    best = min(heur, key=lambda n: measured[n]["median_ms"]) if heur else None
    return {
        "name": record["name"],
        "kind": record["kind"],
        "tables": len(task.tables),
        "devices": task.num_devices,
        "batch_size": task.batch_size,
        "torchrec_accounting": record["torchrec_accounting"],
        "rounds": len(done),
        "plans": rows,
        "best_heuristic": best,
        "ours_vs_torchrec": ratio(measured, ours, torchrec) if ours else None,
        "ours_vs_best_heuristic": ratio(measured, ours, best) if ours else None,
        "failure": None if failure is None else failure.to_dict(),
    }


def kernel_errors(
    records: list[dict], results: list[dict], done_by_task: list[list[dict]], agents: dict[str, Any]
) -> dict[str, Any]:
    """The cost network's error on the plans' fused device kernels (measured in step 4,
    none of them a calibration kernel: new groups, at the tasks' own batches): MAPE (%)
    of the predicted fwd + bwd, per agent."""
    pairs: dict[tuple, tuple[Any, list[int], int, float]] = {}
    for record, result, done in zip(records, results, done_by_task, strict=True):
        task = record["task"]
        for name, row in result["plans"].items():
            if not row["rounds_ms"]:
                continue
            for d in range(task.num_devices):
                tables = tuple(i for i, dev in enumerate(row["placement"]) if dev == d)
                ms = [r[name].per_device[d] for r in done if name in r]
                if tables and ms:
                    key = (record["name"], tables)
                    true = statistics.median(c.fwd_ms + c.bwd_ms for c in ms)
                    pairs.setdefault(key, (task, row["placement"], d, true))
    out: dict[str, Any] = {"kernels": len(pairs)}
    for label, agent in agents.items():
        errors = []
        for task, placement, d, true in pairs.values():
            pred = agent.predict(task, placement)
            errors.append(abs(pred.fwd_ms[d] + pred.bwd_ms[d] - true) / max(true, 1e-9))
        out[label] = float(np.mean(errors) * 100) if errors else None
    return out


def check_device(device: str) -> None:
    """Refuse ``--device cuda`` where torch sees no GPU (naming what to do)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "gpu_check run --device cuda: torch sees no CUDA device here "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}); run it on "
            "a GPU machine, or pass --device cpu"
        )


def run(args: argparse.Namespace) -> int:
    """Steps 1 to 5 (see the module docstring)."""
    check_device(args.device)
    from torchrec_dreamshard.measure import MeasureConfig
    from torchrec_dreamshard.policy.checkpoint import load_checkpoint

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest, records = load_prepared(Path(args.inp))
    info = machine(args.device)
    say(
        f"gpu_check run on {info['device_model']} ({args.device}), {len(records)} tasks, "
        f"budget {args.budget_s:.0f} s; torch {info['versions']['torch']}, "
        f"FBGEMM {info['versions']['fbgemm_gpu']}"
    )
    start = time.perf_counter()
    comm_path = comm_models_path(args.device, out)
    config = MeasureConfig(device=args.device, rounds=1, comm_model_path=comm_path)
    failures: list[Any] = []
    reference = reference_step(args.device, failures)
    prior = load_checkpoint(args.checkpoint)
    cal = calibrate_step(prior, records, config, args.budget_s * CALIBRATION_SHARE, out, args.seed)
    failures += cal.failures
    say("3/5 planning every task with the policy")
    plans = [plans_of(r, prior, cal.agent) for r in records]
    comm = comm_model(comm_path, args.device, failures)
    results, rounds = measure_step(records, plans, config, comm, args, start, cal.agent, failures)
    errors = kernel_errors(records, results, rounds, {"before": prior, "after": cal.agent})
    data = {
        "format": FORMAT,
        **info,
        "prepared": {k: manifest[k] for k in ("small", "seed", "versions")},
        "torchrec_imported": "torchrec" in sys.modules,
        "settings": {
            "budget_s": args.budget_s,
            "rounds": args.rounds,
            "measure": dataclasses.asdict(config),
        },
        "reference_ms": None if reference is None else {"fwd": reference[0], "bwd": reference[1]},
        "comm": getattr(comm, "source", None),
        "calibration": cal.to_dict(),
        "cost_error": {
            "calibration_kernels": {
                "before": cal.before.get("cost/mape"),
                "after": cal.after.get("cost/mape"),
                "kernels": cal.samples,
                "in_sample": True,
            },
            "plan_kernels": errors,
        },
        "tasks": results,
        "failures": [f.to_dict() for f in failures],
        "seconds": time.perf_counter() - _START,
    }
    write_results(data, prior, cal, out)
    return 0


def reference_step(device: str, failures: list) -> tuple[float, float] | None:
    """Step 1: the reference kernel's ``(fwd_ms, bwd_ms)`` (``None``: it failed, the
    failure appended to ``failures``)."""
    from torchrec_dreamshard.measure.guard import MeasureFailure, guarded
    from torchrec_dreamshard.measure.reference_speed import measure_reference_ms

    ms = guarded("the reference kernel", lambda: measure_reference_ms(device), device=device)
    if isinstance(ms, MeasureFailure):
        failures.append(ms)
        return None
    say(f"1/5 reference kernel: fwd {ms[0]:.3f} ms, bwd {ms[1]:.3f} ms")
    return ms


def measure_step(
    records: list[dict],
    plans: list[dict],
    config: Any,
    comm: Any,
    args: argparse.Namespace,
    start: float,
    agent: Any,
    failures: list,
) -> tuple[list[dict], list[list[dict]]]:
    """Step 4 over every task, each given an equal share of what is left of the budget;
    every task's result and rounds."""
    deadline = start + args.budget_s
    results, rounds = [], []
    for i, (record, named) in enumerate(zip(records, plans, strict=True)):
        left = (deadline - time.perf_counter()) / (len(records) - i)
        task = record["task"]
        say(
            f"4/5 measuring {len(named)} plans of {record['name']} ({len(task.tables)} "
            f"tables, {task.num_devices} devices) within {max(left, 0):.0f} s"
        )
        done, failed = measure_task(
            task, named, config, comm, args.rounds, time.perf_counter() + left
        )
        if failed is not None:
            failures.append(failed)
        results.append(task_result(record, named, done, agent, failed))
        rounds.append(done)
        say("    " + margins_line(results[-1]))
    return results, rounds


def write_results(data: dict, prior: Any, cal: Any, out: Path) -> None:
    """Step 5: ``results.json`` and the profile (``cal``: the calibration's result)."""
    from torchrec_dreamshard.io import atomic_write, dumps_strict

    atomic_write(out / "results.json", dumps_strict(data), "results file")
    save_profile(prior, cal, data, out)
    errors = data["cost_error"]["plan_kernels"]
    say(
        f"5/5 wrote {out / 'results.json'} and the profile {out / 'profile.pt'}; the plans' "
        f"kernels: {fmt(errors.get('before'))}% error before calibration, "
        f"{fmt(errors.get('after'))}% after ({errors['kernels']} kernels)"
    )


def comm_model(path: str | None, device: str, failures: list) -> Any:
    """The all-to-all model the measured plans are charged (the analytic one where
    loading or timing the machine's fails, the failure recorded)."""
    from torchrec_dreamshard.cost.collective_models import load_all_to_all_model
    from torchrec_dreamshard.cost.comm_topology import CommTopology, analytic_models
    from torchrec_dreamshard.measure.guard import MeasureFailure, guarded

    model = guarded("the all-to-all model", lambda: load_all_to_all_model(path), device=device)
    if isinstance(model, MeasureFailure):
        failures.append(model)
        return analytic_models(CommTopology(world_size=2)).models["all_to_all"]
    return model


def save_profile(prior: Any, cal: Any, data: dict, out: Path) -> None:
    """The profile it learned (``profile.pt``, a ``MachineProfile``: the reference kernel
    and the cost network calibrated on this device's kernels, stamped with the device and
    versions; ``DreamShardPlanner(profile=...)`` plans from it) and its summary beside it
    (``profile.json``)."""
    from torchrec_dreamshard.io import atomic_write, dumps_strict
    from torchrec_dreamshard.profile.machine_profile import MachineProfile, ProfileCalibration
    from torchrec_dreamshard.profile.stamp import MachineStamp

    ref = data["reference_ms"]
    calibration = None
    if cal.agent is not prior and cal.samples:
        calibration = ProfileCalibration(
            prior=prior.fingerprint(),
            cost_net={k: v.detach().clone() for k, v in cal.agent.cost_net.state_dict().items()},
            meta=dict(cal.agent.meta),
            summary=cal.summary(),
        )
    profile = MachineProfile(
        stamp=MachineStamp.here(data["device"], 1, 1),
        reference_ms=None if ref is None else (ref["fwd"], ref["bwd"]),
        calibration=calibration,
        notes=("measured by benchmarks/gpu_check.py on one device: no collectives",),
    )
    profile.save(out / "profile.pt")
    summary = profile.summary() | {"file": "profile.pt", "format": FORMAT}
    atomic_write(out / "profile.json", dumps_strict(summary), "profile file")


def fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def margins_line(result: dict) -> str:
    """``demo: ours 12.3 ms, 0.95x TorchRec's, 0.98x the best heuristic's (size), 3 rounds``."""
    rows = {n: r for n, r in result["plans"].items() if "median_ms" in r}
    ours = next((r for n, r in rows.items() if n.split("=")[0] == "dreamshard"), None)
    if ours is None:
        why = result["failure"]["message"] if result["failure"] else "no round fitted"
        return f"{result['name']}: not measured ({why})"
    parts = [f"{result['name']}: ours {ours['median_ms']:.2f} ms"]
    if result["ours_vs_torchrec"] is not None:
        parts.append(f"{result['ours_vs_torchrec']:.3f}x TorchRec's")
    if result["ours_vs_best_heuristic"] is not None:
        parts.append(
            f"{result['ours_vs_best_heuristic']:.3f}x the best heuristic's "
            f"({result['best_heuristic']})"
        )
    rounds = result["rounds"]
    return ", ".join(parts) + f", {rounds} round{'s' if rounds != 1 else ''}"


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    pre = sub.add_parser("prepare", help="write the tasks and TorchRec's plans (needs TorchRec)")
    pre.add_argument("--out", required=True, metavar="DIR")
    pre.add_argument("--small", action="store_true", help="small tasks (CI, --device cpu)")
    pre.add_argument("--seed", type=int, default=0)
    pre.set_defaults(func=prepare)
    go = sub.add_parser("run", help="measure on this device (torch and FBGEMM only)")
    go.add_argument("--in", dest="inp", required=True, metavar="DIR", help="prepare's --out")
    go.add_argument("--out", required=True, metavar="DIR")
    go.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    go.add_argument(
        "--budget-s",
        type=positive,
        default=180.0,
        help="seconds of measuring, calibration included (default 180)",
    )
    go.add_argument("--rounds", type=int, default=3, help="interleaved rounds per task")
    go.add_argument("--checkpoint", metavar="PATH", help="the prior agent (default: bundled)")
    go.add_argument("--seed", type=int, default=0)
    go.set_defaults(func=run)
    return p.parse_args(argv)


def positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    fn: Callable[[argparse.Namespace], int] = args.func
    return fn(args)


if __name__ == "__main__":
    sys.exit(main())
