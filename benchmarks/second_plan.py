"""A second first plan on the same machine: does it time any machine-level quantity again?
And do cold default first plans at scale keep to the default budget in wall time?

**Second plan.** On one empty cache (a fresh ``$XDG_CACHE_HOME``), ``dreamshard plan A.json
--out A_plan.json`` then ``dreamshard plan B.json --out B_plan.json``, each its own
process, no other flag: task A (``--a`` tables on 2 devices) and task B (``--b`` other
tables on 4 devices), held-out pool tables at ``MEMORY_FACTOR`` memory
(``harness.task_draws.heldout_tasks``, as ``benchmarks/plan_budget.py`` draws them). For
each plan: the process's wall seconds, ``plan()``'s own seconds (the command's ``placed
... in S s`` line), ``adaptation["spent_s"]`` per part and ``measuring_notes``, and the
cache files the process wrote or rewrote. The report says whether B timed a machine-level
quantity (reference kernel, collectives, dense kernel, sharding path) again: by the notes
(what B loaded from the cache), by the seconds it spent on each, and by the cache files
it changed.

**At scale.** Cold default first plans (each its own empty cache, the same command) of
``--scale`` shapes (default 150 tables on 16 devices and 400 on 32), against the default
budget (``FIRST_PLAN_BUDGET_S``) in wall time.

Raw results ``results/NAME.json``, summary ``NAME.md`` (``--name``, default
``second_plan``); each finished plan is saved as it ends and a rerun with the same
settings skips it.

Usage::

    python benchmarks/second_plan.py                        # about 4 minutes
    python benchmarks/second_plan.py --scale                # A and B only
    python benchmarks/second_plan.py --a 10 --b 12 --scale --name second_plan_smoke
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchrec_dreamshard.planner.steps.profile_step import FIRST_PLAN_BUDGET_S

from harness.results_files import RESULTS, load_raw, machine, save_raw
from harness.task_draws import heldout_tasks
from harness.user_planning import CACHE_ENV

MEMORY_FACTOR = 3.0  # as benchmarks/plan_budget.py
MACHINE_LEVEL = ("reference kernel", "collectives", "dense kernel", "sharding path")
LOADED = "measured once per machine, loaded from its cache: "
PLACED = re.compile(r"^placed \d+ tables on \d+ devices .* in ([0-9.]+)s", re.M)
DREAMSHARD = Path(sys.executable).with_name("dreamshard")


def cache_state(root: Path) -> dict[str, list[float]]:
    """Every file under ``root``: ``[mtime, size]`` by relative path."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(root))] = [st.st_mtime, st.st_size]
    return out


def changed(before: dict, after: dict) -> list[str]:
    return sorted(k for k, v in after.items() if before.get(k) != v)


def cli_plan(task_dict: dict, home: Path, work: Path, label: str) -> dict:
    """``dreamshard plan TASK --out PLAN`` in a process of its own with ``$XDG_CACHE_HOME``
    = ``home``: wall seconds, ``plan()`` seconds, the summary's adaptation and types."""
    task_path, out = work / f"{label}.json", work / f"{label}_plan.json"
    task_path.write_text(json.dumps(task_dict))
    env = {k: v for k, v in os.environ.items() if k not in CACHE_ENV}
    env["XDG_CACHE_HOME"] = str(home)
    before = cache_state(home)
    cmd = [str(DREAMSHARD), "plan", str(task_path), "--out", str(out)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    entry = {
        "label": label,
        "shape": [len(task_dict["tables"]), task_dict["num_devices"]],
        "process_s": wall,
        "returncode": proc.returncode,
        "cache_changed": changed(before, cache_state(home)),
    }
    found = PLACED.search(proc.stdout)
    entry["plan_s"] = float(found.group(1)) if found else None
    if proc.returncode != 0 or not out.exists():
        entry["error"] = (proc.stderr.strip().splitlines() or ["no output"])[-1][:500]
        return entry
    summary = json.loads(out.read_text())
    adaptation = summary.get("adaptation", {})
    entry["spent_s"] = adaptation.get("spent_s")
    entry["measuring_notes"] = adaptation.get("measuring_notes")
    entry["loaded"] = loaded_from_cache(entry["measuring_notes"])
    entry["types"] = type_counts(summary)
    return entry


def loaded_from_cache(notes: list[str] | None) -> list[str]:
    """The machine-level quantities the notes say came from the cache."""
    for note in notes or []:
        if note.startswith(LOADED):
            return [n.strip() for n in note[len(LOADED) :].split(",")]
    return []


def type_counts(summary: dict) -> dict[str, int]:
    """Sharding types of a ``--out`` summary: table-wise (placed), split, the rest."""
    counts = {"table_wise": len(summary.get("placement", {}))}
    if summary.get("shards"):
        counts["column_wise"] = len(summary["shards"])
    for other in summary.get("sharding", {}).values():
        counts[other["sharding_type"]] = counts.get(other["sharding_type"], 0) + 1
    return counts


def timed_again(a: dict, b: dict) -> dict[str, str]:
    """Per machine-level quantity, whether plan B timed it again after A, in words: by the
    notes (what B loaded), the seconds B spent on it and the cache file it wrote (each
    quantity's file is named for it: ``reference_kernel_cpu_*.json``, ...)."""
    spent = {k.replace("_", " "): v for k, v in (b.get("spent_s") or {}).items()}
    out = {}
    for what in MACHINE_LEVEL:
        stem = what.replace(" ", "_")
        wrote_a = [f for f in a.get("cache_changed", []) if Path(f).name.startswith(stem)]
        wrote_b = [f for f in b.get("cache_changed", []) if Path(f).name.startswith(stem)]
        secs = f"; B spent {spent[what]:.2f} s on it" if what in spent else ""
        if wrote_b and wrote_a:
            out[what] = "**yes**: timed again (B rewrote its cache file)" + secs
        elif wrote_b:
            out[what] = "first timed by B (A did not time it)" + secs
        elif what in b.get("loaded", []):
            out[what] = "no: loaded from the cache (the notes say so)" + secs
        elif what in spent:
            out[what] = "no cache file written (loaded, or timed and not kept)" + secs
        else:
            out[what] = "not asked for"
    return out


def entry_lines(e: dict) -> list[str]:
    head = f"- **{e['label']}** ({e['shape'][0]} tables, {e['shape'][1]} devices): "
    if "error" in e:
        return [head + f"failed: {e['error']}"]
    plan_s = "n/a" if e["plan_s"] is None else f"{e['plan_s']:.1f}"
    spent = ", ".join(f"{k} {v:.1f}" for k, v in (e.get("spent_s") or {}).items())
    lines = [
        head + f"process {e['process_s']:.1f} s, `plan()` {plan_s} s (budget "
        f"{FIRST_PLAN_BUDGET_S:g} s); types {e['types']}",
        f"  - spent_s: {spent or '-'}",
        f"  - measuring notes: {'; '.join(e.get('measuring_notes') or []) or '-'}",
        f"  - cache files written: {', '.join(e['cache_changed']) or 'none'}",
    ]
    return lines


def report(raw: dict, command: str) -> str:
    lines = [
        "# A second first plan on one cache, and cold first plans at scale",
        "",
        f"`dreamshard plan TASK --out PLAN`, no other flag, each a process of its own. Machine: "
        f"{raw['machine'].get('device_name')}. {raw['machine']['note']} Produced by "
        f"`{command}`.",
        "",
        "## Two first plans, one empty cache",
        "",
    ]
    pair = raw["pair"]
    for e in pair:
        lines += entry_lines(e)
    if len(pair) == 2 and "error" not in pair[1]:
        again = timed_again(pair[0], pair[1])
        lines += ["", "Did B time a machine-level quantity again?", ""]
        lines += [f"- {k}: {v}" for k, v in again.items()]
        shared = raw.get("shared_tables", 0)
        lines += ["", f"Tables A and B share: {shared}."]
    lines += ["", "## Cold default first plans at scale", ""]
    for e in raw["scale"]:
        lines += entry_lines(e)
    within = [e for e in raw["scale"] if e.get("plan_s") is not None]
    over = [e["label"] for e in within if e["plan_s"] > FIRST_PLAN_BUDGET_S]
    if within:
        lines += ["", f"Over the budget by `plan()` wall time: {', '.join(over) or 'none'}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="examples:\n  python benchmarks/second_plan.py\n"
        "  python benchmarks/second_plan.py --a 10 --b 12 --scale --name second_plan_smoke",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--a", type=int, default=20, help="task A's tables (2 devices)")
    ap.add_argument("--b", type=int, default=40, help="task B's tables (4 devices)")
    ap.add_argument(
        "--scale",
        nargs="*",
        default=["150x16", "400x32"],
        metavar="TxD",
        help="cold first plans at scale (none: --scale alone)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="second_plan")
    args = ap.parse_args(argv)
    scale = [tuple(int(x) for x in s.split("x")) for s in args.scale]
    settings = {"a": args.a, "b": args.b, "scale": args.scale, "seed": args.seed}
    path = RESULTS / f"{args.name}.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw = load_raw(path, settings)
    raw.setdefault("pair", [])
    raw.setdefault("scale", [])
    a, b, *big = heldout_tasks([(args.a, 2), (args.b, 4), *scale], args.seed, MEMORY_FACTOR)
    raw["shared_tables"] = len({t.name for t in a.tables} & {t.name for t in b.tables})
    with tempfile.TemporaryDirectory(prefix="second_plan_") as tmp:
        work = Path(tmp)
        if len(raw["pair"]) < 2:  # the pair runs again whole: B must follow A on one cache
            home = work / "cache_pair"
            home.mkdir()
            raw["pair"] = [cli_plan(t.to_dict(), home, work, n) for t, n in ((a, "A"), (b, "B"))]
            save_raw(path, raw)
        for task, shape in zip(big, args.scale, strict=True):
            if any(e["label"] == shape for e in raw["scale"]):
                continue
            home = work / f"cache_{shape}"
            home.mkdir()
            raw["scale"].append(cli_plan(task.to_dict(), home, work, shape))
            save_raw(path, raw)
            print(f"{shape}: plan() {raw['scale'][-1].get('plan_s')} s", flush=True)
    raw["machine"] = machine()
    save_raw(path, raw)
    text = report(raw, "python " + " ".join(sys.argv))
    (RESULTS / f"{args.name}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
