"""The README's results, and the figures the docs quote from `benchmarks/results/`, written
from those files: `python benchmarks/readme_figures.py` rewrites every generated block;
`--check` rewrites nothing and exits 1 naming each block or line that disagrees with its
files (`tests/test_readme_figures.py` runs it).

A generated block sits between `<!-- NAME:begin ... -->` and `<!-- NAME:end -->` in its
page; a generated line is the one line of its page that starts with a given prefix (a row
of a hand-written table). Each figure's host (CPU model) and commit come from the results
file itself: where a file records no commit, the row says "commit not recorded"; where it
records no CPU model, "CPU model not recorded". No figure is typed here: a figure that
is in no results file cannot be generated, and so is not quoted in a generated block.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NO_COMMIT = "commit not recorded"
NO_HOST = "CPU model not recorded"
HOST_KEYS = ("device_name", "cpu")  # where results files record the CPU model
NUM = r"(\d+(?:\.\d+)?)"  # a figure, without the full stop that may end its sentence
SKIP_KEYS = {"tables", "plan", "plans", "rounds", "placement", "per_device", "raw", "rows"}


class FigureError(ValueError):
    """A results file lacks what a figure needs (named), or two files disagree."""


# --- reading results files ---------------------------------------------------------------


def text(name: str) -> str:
    path = RESULTS / name
    if not path.exists():
        raise FigureError(f"benchmarks/results/{name}: no such file")
    return path.read_text()


def data(name: str) -> Any:
    return json.loads(text(name))


def _values(obj: Any, keys: tuple[str, ...], depth: int = 0) -> Iterator[str]:
    """Every string value under one of ``keys`` in ``obj`` (plans and rounds skipped)."""
    if depth > 6:
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in keys and isinstance(v, str):
                yield v
            elif k not in SKIP_KEYS:
                yield from _values(v, keys, depth + 1)
    elif isinstance(obj, list):
        for v in obj[:4]:
            yield from _values(v, keys, depth + 1)


def clean_host(name: str) -> str:
    """``Intel(R) Xeon(R) Processor`` -> ``Intel Xeon``."""
    name = re.sub(r"\((R|TM)\)", "", name)
    name = re.sub(r"\b(Processor|CPU)\b", "", name)
    return " ".join(name.split())


def host(obj: Any) -> str:
    """The CPU model(s) a results file records."""
    found = sorted({clean_host(v) for v in _values(obj, HOST_KEYS) if v.strip()})
    return " and ".join(found) if found else NO_HOST


def commit(obj: Any) -> str:
    """The commit a results file records (short), else :data:`NO_COMMIT`."""
    found = sorted({v[:7] for v in _values(obj, ("commit",)) if re.fullmatch(r"[0-9a-f]{7,40}", v)})
    return ", ".join(found) if found else NO_COMMIT


def devices(obj: Any) -> set[str]:
    """The device kinds a results file records measuring on (``cpu``, ``cuda``)."""
    return {v for v in _values(obj, ("device",)) if v in ("cpu", "cuda")}


def sections(md: str) -> dict[str, str]:
    """A results page's ``### name: ...`` sections by their first word."""
    parts = re.split(r"^### ", md, flags=re.M)[1:]
    return {re.split(r"[:\s]", p, maxsplit=1)[0]: p for p in parts}


def table_rows(md: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the first Markdown table whose first header cell is ``first_header``."""
    lines = md.splitlines()
    for i, line in enumerate(lines):
        cells = _cells(line)
        if cells and cells[0] == first_header:
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(dict(zip(cells, _cells(row), strict=False)))
            return rows
    raise FigureError(f"no table headed {first_header!r}")


def _cells(line: str) -> list[str]:
    if not line.startswith("|"):
        return []
    return [c.strip() for c in line.strip().strip("|").split("|")]


def ratio(section: str, name: str = "dreamshard / torchrec") -> tuple[str, str]:
    """A step-time section's ratio (``0.565 [0.524, 0.604]``) and its verdict."""
    for row in table_rows(section, "ratio"):
        if row["ratio"] == name:
            return row["median [interval]"], row["verdict"]
    raise FigureError(f"no ratio {name!r}")


def beyond(verdict: str) -> bool:
    """Whether a step-time verdict calls a difference beyond the interval."""
    return "faster" in verdict or "slower" in verdict


def first(pattern: str, md: str, name: str) -> re.Match[str]:
    m = re.search(pattern, md, flags=re.M)
    if m is None:
        raise FigureError(f"benchmarks/results/{name}: no match for {pattern!r}")
    return m


def link(name: str, depth: str = "") -> str:
    return f"[{name}]({depth}benchmarks/results/{name})"


# --- the README's results ------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One row of the README's results table."""

    what: str
    ours: str
    reference: str
    source: str  # the results file (linked)
    host: str
    commit: str

    def line(self) -> str:
        cells = (self.what, self.ours, self.reference, self.host, self.commit, link(self.source))
        return "| " + " | ".join(cells) + " |"


def demo_row() -> Row:
    d = data("demo.json")
    ours, theirs = d["planners"]["dreamshard"], d["planners"]["torchrec"]
    a, b = ours["measured"]["step_ms"], theirs["measured"]["step_ms"]
    check_demo_text(a, b)
    task = d["task"]
    what = (
        f"`make demo`: {len(task['tables'])} tables of the pool's test half on "
        f"{task['num_devices']} devices, measured step, one measurement each"
    )
    return Row(
        what,
        f"{a:.3f} ms, default planner ({demo_adaptation(ours['adaptation'])}; "
        f"planned in {ours['planning_s']:.1f} s)",
        f"TorchRec's planner: {b:.3f} ms (ours {100 * (1 - a / b):.1f}% lower)",
        "demo.txt",
        host(d),
        commit(d),
    )


def check_demo_text(ours_ms: float, theirs_ms: float) -> None:
    """demo.txt and demo.json are one run's: their measured steps agree."""
    m = first(rf"^\s*step\s+{NUM} \|\s+step\s+{NUM}", text("demo.txt"), "demo.txt")
    if (m.group(1), m.group(2)) != (f"{ours_ms:.3f}", f"{theirs_ms:.3f}"):
        raise FigureError(
            f"demo.txt says {m.group(1)} against {m.group(2)} ms, demo.json "
            f"{ours_ms:.3f} against {theirs_ms:.3f}: not one run"
        )


def demo_adaptation(a: dict[str, Any]) -> str:
    err = a.get("reference_error")
    off = f"{abs(err) * 100:.0f}% off" if err is not None else "not checked"
    if a.get("calibrated"):
        did = "calibrated" + (" and verified" if a.get("verified") else ", not verified")
    else:
        did = "no calibration, no verification"
    return f"the checkpoint's reference kernel {off} here: {did}"


def heldout_row() -> Row:
    d = data("generalisation.json")
    fams = {f: v for f, v in d["families"].items() if v.get("heldout")}
    whole = ", ".join(f"{f} {v['compute/dreamshard']:.3f}" for f, v in fams.items())
    split = {
        f: v["compute/dreamshard_split"]
        for f, v in fams.items()
        if f"{v['compute/dreamshard_split']:.3f}" != f"{v['compute/dreamshard']:.3f}"
    }
    split_words = ", ".join(f"{f} {x:.3f}" for f, x in split.items()) or "none differs"
    tasks = d["settings"]["per_family"]
    return Row(
        "placement on the families held out of training, compute over the per-task best of "
        f"four heuristics (geomean of {tasks} tasks each), the bundled checkpoint uncalibrated",
        f"whole tables (`dreamshard`): {whole}; column-wise splits allowed "
        f"(`dreamshard_split`, as `dreamshard plan` plans): {split_words}, the others the same",
        "1.000 (the best heuristic)",
        "generalisation.md",
        host(d),
        commit(d),
    )


def step_row(name: str, raw: str) -> Row:
    md, r = text(name), data(raw)
    parts = sections(md)
    fast, same = [], []
    for family, body in parts.items():
        value, verdict = ratio(body)
        (fast if beyond(verdict) else same).append(f"{family} {value.split()[0]}")
    rounds = r["settings"]["rounds"]
    ours = "; ".join(
        x
        for x in (
            ", ".join(fast) + " (beyond the interval)" if fast else "",
            ", ".join(same) + " (within it)" if same else "",
        )
        if x
    )
    return Row(
        "real DMP steps, the default planner (it calibrates where the checkpoint misprices "
        f"the machine, verifies, chooses types) / TorchRec's, {rounds} rounds, "
        f"{len(parts)} families",
        ours,
        "1.000",
        name,
        host(r),
        commit(r),
    )


def default_row() -> Row:
    md = text("generalisation_r38e_vs_torchrec.md")
    m = first(rf"Geomean default / best heuristic: all {NUM}, held out {NUM}", md, "vs_torchrec")
    t = first(rf"Geomean default / TorchRec where TorchRec planned: {NUM}", md, "vs_torchrec")
    last = first(rf"Geomean default / (\S+): every task {NUM}", md, "vs_torchrec")
    budget = first(r"over the budget: (\w+) \((\d+) of (\d+) tasks\)", md, "vs_torchrec")
    g = data("generalisation_r38e.json")
    return Row(
        "placement on all 11 families, the default `DreamShardPlanner` (no flags; each task a "
        "first plan from an empty cache within the 25 s budget, under TorchRec's storage "
        f"estimate; {budget.group(1)} over it), 1 task each, compute over the best heuristic, "
        "geomean",
        f"{m.group(1)}, held out {m.group(2)}; {t.group(1)}x TorchRec's plan where TorchRec plans",
        f"last round's default (`{last.group(1).rstrip(':')}`) in the same rounds: ours "
        f"{last.group(2)}x it per task",
        "generalisation_r38e_vs_torchrec.md",
        host(g),
        commit(g),
    )


def planning_rows() -> list[Row]:
    d = data("planning_time.json")
    cells = {(r["planner"], r["tables"], r["devices"]): r for r in d["rows"]}
    ours, theirs = cells[("dreamshard-safe", 1000, 64)], cells[("torchrec", 1000, 64)]
    t = "TorchRec's planner: " + (
        f"{theirs['seconds']:.1f} s"
        if theirs["seconds"] is not None
        else re.sub(r" \(cap.*", "", theirs["status"])
    )
    grid = Row(
        "planning 1000 tables on 64 devices (default mode)",
        f"{ours['seconds']:.2f} s",
        t,
        "planning_time.md",
        host(d["meta"]),
        commit(d["meta"]),
    )
    c = d["comparison"]
    runs = [r for r in c["runs"] if r["tables"] == 1000 and r["devices"] == 64]
    med = {p: statistics.median(r["wall_s"] for r in runs if r["planner"] == p) for p in _p(runs)}
    a, b = med["dreamshard"], med["torchrec-table-wise-fused"]
    side = Row(
        f"planning 1000 tables on 64 devices, beside TorchRec's table-wise planner "
        f"({c['meta']['repeats']} alternating rounds)",
        f"{a:.2f} s",
        f"{b:.2f} s ({a / b:.2f}x)",
        "planning_time.md",
        host(c["meta"]),
        commit(c["meta"]),
    )
    return [grid, side]


def _p(runs: list[dict[str, Any]]) -> set[str]:
    return {r["planner"] for r in runs}


def at_scale_row() -> Row:
    md, d = text("at_scale.md"), data("at_scale.json")
    s = d["settings"]
    rows = {r["planner"]: r for r in table_rows(md, "planner")}
    ours = rows["dreamshard"]
    step = first(rf"ours / torchrec_longer_run, step: {NUM}", md, "at_scale.md").group(1)
    comp = first(rf"ours / torchrec_longer_run, compute: {NUM}", md, "at_scale.md").group(1)
    wall, cpu = first(rf"{NUM} \({NUM}\)", ours["planning s (cpu s)"], "at_scale.md").groups()
    longer = rows["torchrec_longer_run"]["planning s (cpu s)"]
    cap = rows["torchrec"]["planning s (cpu s)"]
    hosts = s["devices"] // s["local"]
    return Row(
        f"planning {s['tables']} tables for {s['devices']} GPUs in {hosts} hosts of "
        f"{s['local']} (meta tensors, every sharding type); each plan's kernels measured on "
        "this CPU, collectives modelled",
        f"{wall} s wall ({cpu} s CPU); {ours['sharding types']}; {step}x TorchRec's plan by "
        f"the modelled step, {comp}x by the slowest device's measured compute",
        f"TorchRec's planner: no plan at {cap.split()[0]} s; a longer run's plan "
        f"({longer} s) scored",
        "at_scale.md",
        host(d),
        commit(d),
    )


def training_row() -> Row:
    d = data("training_cost.json")
    minutes = d["total_s"] / 60
    return Row(
        "training the bundled checkpoint from an empty store",
        f"{minutes:.1f} min, {d['measurements']} measured placements",
        "target: 30 min",
        "training_cost.md",
        host(d),
        commit(d),
    )


def first_run_row() -> Row:
    d = data("first_run.json")
    med = first_run_medians(d)
    parts = [f"{n} ranks: cold {c:.1f} s, warm {w:.1f} s" for n, (c, w) in sorted(med.items())]
    return Row(
        "a TorchRec DLRM job's first `collective_plan` (8 tables, `torchrun`), empty cache "
        "then warm, median of 3 rounds",
        "; ".join(parts),
        "-",
        "first_run.md",
        host(d),
        commit(d),
    )


def first_run_medians(d: dict[str, Any]) -> dict[int, tuple[float, float]]:
    out = {}
    for n in sorted({r["ranks"] for r in d["rows"]}):
        cold = [r["plan_s"] for r in d["rows"] if r["ranks"] == n and r["cache"] == "cold"]
        warm = [r["plan_s"] for r in d["rows"] if r["ranks"] == n and r["cache"] == "warm"]
        out[n] = (statistics.median(cold), statistics.median(warm))
    return out


def replan_figure() -> tuple[str, str, str]:
    """The undeclared family's re-plan against the first plan: figure, host, commit."""
    md, d = text("feedback_r25i.md"), data("feedback_r25i.json")
    for row in table_rows(md, "family"):
        if row["family"] == "undeclared":
            value = re.sub(r"; \d+%\]", "]", row["re-plan / first step"])
            return value, host(d), commit(d)
    raise FigureError("feedback_r25i.md: no undeclared row")


def replan_row() -> Row:
    value, h, c = replan_figure()
    rounds = data("feedback_r25i.json")["args"]["rounds"]
    return Row(
        "learning from the running job: the re-plan's training step over the first plan's "
        f"(`undeclared`: tables fed 40 to 100 ids a sample, none declared), {rounds} rounds",
        value,
        "1.000",
        "feedback_r25i.md",
        h,
        c,
    )


def step_family_label(section: str) -> str:
    head = section.splitlines()[0]
    m = re.match(r"(\w+): (\d+) bag tables, (\d+) sequence tables", head)
    if m is None:
        raise FigureError(f"step-time section {head!r}")
    family, bags, seqs = m.group(1), int(m.group(2)), int(m.group(3))
    tables = f"{bags} tables" if not seqs else f"{bags} bag and {seqs} sequence tables"
    return f"{family} ({tables})"


def step_table() -> list[str]:
    files = (
        ("step_time.md", "step_time_raw.json"),
        ("step_time_epyc.md", "step_time_epyc_raw.json"),
    )
    pages = [(name, sections(text(name)), data(raw)) for name, raw in files]
    head = ["family"]
    for name, _, raw in pages:
        cover = first(rf"probability {NUM}%", text(name), name).group(1) + "%"
        head.append(
            f"ours / TorchRec, {host(raw)}, {raw['settings']['rounds']} rounds, {cover} "
            f"intervals ({link(name)})"
        )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for family in pages[0][1]:
        cells = [step_family_label(pages[0][1][family])]
        same = False
        for _, parts, _ in pages:
            value, verdict = ratio(parts[family])
            same |= "identical plans" in verdict
            cells.append(f"**{value}**" if beyond(verdict) else value)
        if same:
            cells[0] += ", the same plan as TorchRec's"
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("| commit | " + " | ".join(commit(raw) for _, _, raw in pages) + " |")
    lines += ["", noise_line(pages)]
    return lines


def noise_line(pages: list[tuple[str, dict[str, str], Any]]) -> str:
    spans = []
    for _, parts, raw in pages:
        values = []
        for body in parts.values():
            for row in table_rows(body, "ratio"):
                if "identical plans" in row["verdict"]:
                    values.append(float(row["median [interval]"].split()[0]))
        spans.append(f"{min(values):.3f} to {max(values):.3f}x on the {host(raw)}")
    return (
        "Identical plans measured up to a few percent apart (" + "; ".join(spans) + "): "
        "differences that small are noise there."
    )


def cpu_only_line(names: list[str]) -> str:
    kinds: set[str] = set()
    for name in names:
        kinds |= devices(data(name))
    if kinds != {"cpu"}:
        raise FigureError(f"the README's results files record devices {sorted(kinds)}")
    return (
        "**Every figure here is a CPU figure**: each file below that records its device "
        "records `cpu` (FBGEMM's CPU kernels on 2-core VMs, one thread per simulated device, "
        "row-wise Adagrad, fp32). **No GPU figure exists yet** "
        "([On GPUs](#on-gpus)); the at-scale row plans for GPUs and measures each plan's "
        "kernels on a CPU."
    )


README_JSON = [
    "demo.json",
    "generalisation.json",
    "step_time_r32_raw.json",
    "step_time_r38g_raw.json",
    "generalisation_r38e.json",
    "at_scale.json",
    "training_cost.json",
    "step_time_raw.json",
    "step_time_epyc_raw.json",
]


def readme_results() -> str:
    rows = [
        demo_row(),
        heldout_row(),
        step_row("step_time_r32.md", "step_time_r32_raw.json"),
        step_row("step_time_r38g.md", "step_time_r38g_raw.json"),
        default_row(),
        replan_row(),
        first_run_row(),
        *planning_rows(),
        at_scale_row(),
        training_row(),
    ]
    out = [cpu_only_line(README_JSON), ""]
    out += [
        "**Real DMP training steps**, `DreamShardPlanner` as it was at each run (every sharding "
        "type its sharders allow) against TorchRec's `EmbeddingShardingPlanner`, 2 gloo ranks, "
        "per-rank batch 512, median of the per-round ratio with its order-statistic interval "
        "(below 1: ours is faster; bold: beyond the interval):",
        "",
        *step_table(),
        "",
        "| what | DreamShard | reference | host | commit | source |",
        "|---|---|---|---|---|---|",
        *(r.line() for r in rows),
    ]
    return "\n".join(out)


def readme_replan() -> str:
    value, h, c = replan_figure()
    rounds = data("feedback_r25i.json")["args"]["rounds"]
    return (
        "In a later run of `benchmarks/feedback.py` than the one whose report that page shows, "
        "in the `undeclared` family (four tables fed 40 to 100 ids a sample, none declared), "
        f"the new plan's training step measured {value} of the first plan's over {rounds} "
        f"alternating rounds, {h}, {c} ({link('feedback_r25i.md')}; "
        "[results](docs/results.md#learning-from-the-job-what-it-was-fed))."
    )


# --- docs/results.md and docs/first_run.md --------------------------------------------------


def demo_block() -> str:
    d = data("demo.json")
    ours, theirs = d["planners"]["dreamshard"], d["planners"]["torchrec"]
    a, b = ours["measured"]["step_ms"], theirs["measured"]["step_ms"]
    check_demo_text(a, b)
    job = d["training"]
    job_spent = job["adaptation"]["spent_s"]
    nothing = ", nothing measured" if set(job_spent) <= {"planning"} else ""
    rows = [
        (
            "measured step on real kernels",
            f"**{a:.3f} ms** ({100 * (1 - a / b):.1f}% lower)",
            f"{b:.3f} ms",
        ),
        (
            "predicted by the planner's cost network",
            f"{ours['predicted_step_ms']:.3f} ms",
            f"{theirs['predicted_step_ms']:.3f} ms",
        ),
        (
            "predicted by the checkpoint as it is",
            f"{ours['checkpoint_step_ms']:.3f} ms",
            f"{theirs['checkpoint_step_ms']:.3f} ms",
        ),
        (
            "first plan, measuring included",
            f"{ours['planning_s']:.1f} s",
            f"{theirs['planning_s']:.2f} s",
        ),
        (
            f"the job's plan of the same model ({job['ranks']} gloo ranks, from the first "
            "plan's profile)",
            f"{job['planning_s']:.1f} s{nothing}",
            "",
        ),
    ]
    a_ = ours["adaptation"]
    spent = ", ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in a_["spent_s"].items())
    losses = ", ".join(f"{x:.4f}" for x in job["losses"])
    return "\n".join(
        [
            f"{len(d['task']['tables'])} tables on {d['task']['num_devices']} devices (global "
            f"batch {d['task']['global_batch_size']}), one measurement each, {host(d)}, "
            f"{commit(d)} "
            f"({link('demo.txt', '../')}, `demo.json`, `benchmarks/demo.py`):",
            "",
            "| | DreamShard (default planner) | TorchRec's planner |",
            "|---|---|---|",
            *(f"| {w} | {x} | {y} |" for w, x, y in rows),
            "",
            f"The first plan: {a_['why']}; calibrated: {_yes(a_['calibrated'])}, verified: "
            f"{_yes(a_['verified'])}; spent {spent}. The job then trained {job['steps']} steps "
            f"under `DistributedModelParallel` (loss {losses}).",
        ]
    )


def _yes(flag: Any) -> str:
    return "yes" if flag else "no"


def demo_target_line() -> str:
    d = data("demo.json")
    ours, theirs = d["planners"]["dreamshard"], d["planners"]["torchrec"]
    a, b = ours["measured"]["step_ms"], theirs["measured"]["step_ms"]
    job = d["training"]["planning_s"]
    cal = "calibrating" if ours["adaptation"]["calibrated"] else "no calibration needed"
    met = ours["planning_s"] <= 30 and job <= 5 and a < b
    return (
        "| `make demo`: first plan within 30 s, measuring included; the job's plan measures "
        "nothing new within 5 s; still faster than TorchRec's | "
        f"{ours['planning_s']:.1f} s ({cal}); {job:.1f} s; {100 * (1 - a / b):.1f}% below "
        f"TorchRec's (one measurement each; demo.txt) | {_yes(met)} | {host(d)} |"
    )


def at_scale_block() -> str:
    md, d = text("at_scale.md"), data("at_scale.json")
    names = {
        "dreamshard": "DreamShardPlanner",
        "dreamshard_table_wise": "DreamShardPlanner held to table-wise",
        "torchrec": "TorchRec's planner",
        "torchrec_longer_run": "TorchRec's planner, a longer run (`timeout_seconds=120`, "
        "which it checks only between proposals)",
    }
    rows = table_rows(md, "planner")
    head = list(rows[0])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [names.get(row["planner"], row["planner"]), *(row[h] for h in head[1:])]
        out.append("| " + " | ".join(cells) + " |")
    ratios = [line for line in md.splitlines() if line.startswith("- ours / ")]
    return "\n".join(
        [
            f"{host(d)}, {commit(d)}, load average at the end "
            f"{' / '.join(f'{x:.2f}' for x in d['machine']['load_average'])} on "
            f"{d['machine']['cpu_count']} cores ({link('at_scale.md', '../')}, raw "
            "`at_scale.json`):",
            "",
            *out,
            "",
            *ratios,
        ]
    )


def first_run_block(depth: str = "../") -> str:
    d = data("first_run.json")
    rows = table_rows(text("first_run.md"), "ranks")
    out = copied_table(text("first_run.md"), "ranks")
    med = first_run_medians(d)
    for n, (cold, warm) in med.items():
        row = next(r for r in rows if r["ranks"] == str(n))
        if (
            row["cold plan (s)"].split()[0] != f"{cold:.1f}"
            or row["warm plan (s)"].split()[0] != f"{warm:.1f}"
        ):
            raise FigureError(f"first_run.md and first_run.json disagree at {n} ranks")
    cold = [r["adaptation"] for r in d["rows"] if r["cache"] == "cold"]
    warm = [r["adaptation"] for r in d["rows"] if r["cache"] == "warm"]
    cal_s = [a["seconds"] for a in cold if a.get("seconds") is not None]
    ver_s = [a["verify_seconds"] for a in cold if a.get("verify_seconds") is not None]
    reused = all(a.get("kernels_measured") == 0 and a.get("verify_cached") for a in warm)
    warm_words = (
        "every warm plan measured no kernel and took the verification's rounds from the cache"
        if reused
        else "some warm plans measured again"
    )
    return "\n".join(
        [
            f"{host(d)}, {d['cores']} cores, {commit(d)} ({link('first_run.md', depth)}; "
            "rank 0's planner construction and `collective_plan`, median [min, max] over 3 "
            "rounds, each round a fresh empty cache, cold then warm):",
            "",
            *out,
            "",
            f"Of the cold plans, calibrating took {min(cal_s):.1f}-{max(cal_s):.1f} s and "
            f"verifying {min(ver_s):.1f}-{max(ver_s):.1f} s; {warm_words}.",
        ]
    )


def first_plan_steps_block() -> str:
    """What each first plan of generalisation_r38e spent, step by step."""
    d = data("generalisation_r38e_vs_torchrec.json")
    g = data("generalisation_r38e.json")
    rows = [r for r in d["rows"] if r.get("spent_s")]
    steps: dict[str, list[float]] = {}
    for r in rows:
        for k, v in r["spent_s"].items():
            steps.setdefault(k, []).append(v)
    out = ["| step | tasks that spent on it | median s | range s |", "|---|---|---|---|"]
    for k, vs in steps.items():
        out.append(
            f"| {k.replace('_', ' ')} | {len(vs)} of {len(rows)} | {statistics.median(vs):.1f} "
            f"| {min(vs):.1f}-{max(vs):.1f} |"
        )
    total = [r["plan_s"] for r in rows]
    out.append(
        f"| the whole first plan | {len(rows)} | {statistics.median(total):.1f} | "
        f"{min(total):.1f}-{max(total):.1f} |"
    )
    over = sum(1 for r in d["rows"] if r.get("within_budget") is False)
    none = [r["family"] for r in d["rows"] if not r.get("spent_s")]
    return "\n".join(
        [
            f"{host(g)}, {commit(g)}: one task of each of {len(d['rows'])} families (tables held "
            "to table-wise, CPU ranks), each a first plan of the default planner with no flags "
            f"from an empty cache, within the default budget ({over} of {len(d['rows'])} over "
            f"it; {', '.join(none) or 'none'}: no plan, no steps recorded) "
            f"({link('generalisation_r38e_vs_torchrec.md', '../')}, raw "
            "`generalisation_r38e_vs_torchrec.json`):",
            "",
            *out,
        ]
    )


def collectives_block() -> str:
    """docs/guide.md's collectives on threads against processes."""
    md, d = text("collective_ranks.md"), data("collective_ranks.json")
    rows = table_rows(md, "collective")
    head = list(rows[0])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["collective"].replace("_", "-"), *(row[h] for h in head[1:])]
        out.append("| " + " | ".join(cells) + " |")
    fit = first(rf"One fit: {NUM} s on threads, {NUM} s on processes", md, "collective_ranks.md")
    return "\n".join(
        [
            f"{host(d)}, {commit(d)} ({link('collective_ranks.md', '../')}):",
            "",
            *out,
            "",
            f"One fit took {fit.group(1)} s on threads and {fit.group(2)} s on processes "
            "(medians).",
        ]
    )


def cpu_only_block() -> str:
    """What every results file says it measured on."""
    kinds: dict[str, list[str]] = {}
    files = sorted(RESULTS.glob("*.json"))
    for path in files:
        for kind in devices(json.loads(path.read_text())) or {"none recorded"}:
            kinds.setdefault(kind, []).append(path.name)
    gpu = kinds.get("cuda", [])
    if gpu:
        raise FigureError(f"results files record a GPU: {gpu}; say so in the docs")
    return (
        f"**Every figure on this page is a CPU figure; no GPU figure exists yet.** Of the "
        f"{len(files)} JSON files in `benchmarks/results/`, {len(kinds.get('cpu', []))} "
        "record the device they measured on, and every one records `cpu`; none records a "
        "GPU. Where a section plans for GPUs (at scale), each plan's kernels were measured "
        "on a CPU and the collectives modelled. The CUDA paths (kernels, CUDA events, NCCL, "
        "fp16) are written and have never run."
    )


def copied_table(md: str, first_header: str) -> list[str]:
    """The first table of ``md`` headed ``first_header``, as its lines."""
    rows = table_rows(md, first_header)
    head = list(rows[0])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(r[h] for h in head) + " |" for r in rows]


def user_path_block() -> str:
    """The default as users run it (``dreamshard plan TASK``), from this round's run."""
    name = "user_path_r47"
    md, d = text(f"{name}.md"), data(f"{name}.json")
    rounds = first(r"(\d+) of (\d+) kernel round\(s\) measured", md, f"{name}.md")
    budget = first(r"longest ([\d.]+) s \((\w+), (\w+) memory\); (\d+) of (\d+) over", md, name)
    return "\n".join(
        [
            f"{host(d)}, {commit(d)} ({link(f'{name}.md', '../')}, raw `{name}_raw.json`); "
            f"{rounds.group(1)} of {rounds.group(2)} kernel rounds measured, on a loaded "
            "machine (helpers editing and testing beside it): **one round is not a result**, "
            "so read these as a first look, not against the targets:",
            "",
            *copied_table(md, "memory"),
            "",
            f"Longest default first plan {budget.group(1)} s ({budget.group(2)}, "
            f"{budget.group(3)} memory); {budget.group(4)} of {budget.group(5)} over the 25 s "
            "budget.",
        ]
    )


def budget_block() -> str:
    """Plan time against quality, every type allowed (``budget_table.py``)."""
    md, d = text("budget_table.md"), data("budget_table.json")
    return "\n".join(
        [
            f"{host(d)}, {commit(d)} ({link('budget_table.md', '../')}; families "
            f"{', '.join(d['settings']['families'])} at their own memory, "
            f"{d['settings']['rounds']} kernel rounds):",
            "",
            *copied_table(md, "budget (s)"),
        ]
    )


# --- the pages -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    name: str
    make: Callable[[], str]


@dataclass(frozen=True)
class Line:
    page: str
    prefix: str  # the one line of the page that starts with this
    make: Callable[[], str]


BLOCKS = [
    Block("README.md", "results", readme_results),
    Block("README.md", "replan", readme_replan),
    Block("docs/results.md", "cpu-only", cpu_only_block),
    Block("docs/results.md", "demo", demo_block),
    Block("docs/results.md", "at-scale", at_scale_block),
    Block("docs/results.md", "first-run", first_run_block),
    Block("docs/results.md", "user-path", user_path_block),
    Block("docs/results.md", "budget-types", budget_block),
    Block("docs/first_run.md", "first-run", first_run_block),
    Block("docs/first_run.md", "first-plan-steps", first_plan_steps_block),
    Block("docs/guide.md", "collectives", collectives_block),
]
LINES = [Line("docs/results.md", "| `make demo`: first plan within 30 s", demo_target_line)]


def begin(name: str) -> str:
    return f"<!-- {name}:begin: written by benchmarks/readme_figures.py from benchmarks/results/; do not edit by hand -->"  # noqa: E501


def end(name: str) -> str:
    return f"<!-- {name}:end -->"


def render(page_text: str, block: Block) -> str:
    """``page_text`` with ``block``'s contents regenerated (a :class:`FigureError` where
    its markers are missing)."""
    pattern = re.compile(
        rf"^<!-- {re.escape(block.name)}:begin[^\n]*-->\n.*?^<!-- {re.escape(block.name)}:end -->$",
        flags=re.M | re.S,
    )
    found = pattern.findall(page_text)
    if len(found) != 1:
        raise FigureError(f"{block.page}: {len(found)} '{block.name}' blocks (one is needed)")
    body = f"{begin(block.name)}\n{block.make()}\n{end(block.name)}"
    return pattern.sub(lambda _: body, page_text)


def render_line(page_text: str, line: Line) -> str:
    lines = page_text.split("\n")
    at = [i for i, x in enumerate(lines) if x.startswith(line.prefix)]
    if len(at) != 1:
        raise FigureError(f"{line.page}: {len(at)} lines start with {line.prefix!r}")
    lines[at[0]] = line.make()
    return "\n".join(lines)


def generate(root: Path = ROOT) -> tuple[dict[str, str], list[str]]:
    """Every page with its generated parts written: ``(page -> text, errors)``."""
    pages: dict[str, str] = {}
    errors: list[str] = []
    for part in [*BLOCKS, *LINES]:
        page = pages.get(part.page)
        if page is None:
            path = root / part.page
            if not path.exists():
                errors.append(f"{part.page}: no such page")
                continue
            page = path.read_text()
        try:
            pages[part.page] = (
                render(page, part) if isinstance(part, Block) else render_line(page, part)
            )
        except (FigureError, KeyError, StopIteration, ValueError) as exc:
            what = part.name if isinstance(part, Block) else part.prefix
            errors.append(f"{part.page} [{what}]: {type(exc).__name__}: {exc}")
            pages[part.page] = page
    return pages, errors


def disagreements(root: Path = ROOT) -> list[str]:
    """Each generated block or line whose page differs from what its files say."""
    pages, errors = generate(root)
    out = list(errors)
    for page, new in pages.items():
        old = (root / page).read_text()
        if old == new:
            continue
        diff = difflib.unified_diff(
            old.splitlines(), new.splitlines(), page, "from the files", n=0, lineterm=""
        )
        lines = [d for d in diff if d[:1] in "+-" and d[:3] not in ("+++", "---")]
        shown = "\n    ".join(x[:300] for x in lines[:20])
        more = f"\n    ... {len(lines) - 20} more" if len(lines) > 20 else ""
        out.append(f"{page}: disagrees with benchmarks/results/:\n    {shown}{more}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 on a disagreement")
    args = p.parse_args(argv)
    if args.check:
        problems = disagreements()
        for problem in problems:
            print(problem)
        if not problems:
            print("the README and docs agree with benchmarks/results/")
        return 1 if problems else 0
    pages, errors = generate()
    for page, new in pages.items():
        path = ROOT / page
        if path.read_text() != new:
            path.write_text(new)
            print(f"wrote {page}")
    for error in errors:
        print(error)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
