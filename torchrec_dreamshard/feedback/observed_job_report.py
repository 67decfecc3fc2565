"""The observer's report, a plain JSON-able dict: per rank the sampled steps' medians, the
embedding ms (``fwd + bwd + comm + dp``) beside the prediction, and the rank bounding the step."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from torchrec_dreamshard.feedback.memory_report import memory_lines
from torchrec_dreamshard.feedback.profiling import StepProfile, a2a_split


def measured_by_rank(profiles: Sequence[Sequence[StepProfile]]) -> list[dict[str, float]]:
    """Per rank, the medians over the sampled steps every rank observed."""
    world = len(profiles)
    steps = min((len(p) for p in profiles), default=0)
    rows: list[dict[str, list[float]]] = [{} for _ in range(world)]
    for i in range(steps):
        step = [profiles[r][i] for r in range(world)]
        split = a2a_split([p.a2a for p in step])
        for r, p in enumerate(step):
            comm, wait = split[r]
            figures = {
                "fwd_ms": p.fwd_ms,
                "bwd_ms": p.bwd_ms,
                "comm_ms": comm,
                "comm_wait_ms": wait,
                "dp_ms": p.dp_ms,
                "rest_ms": max(0.0, p.step_ms - p.fwd_ms - p.bwd_ms - p.a2a_ms - p.dp_ms),
                "step_ms": p.step_ms,
                "embedding_ms": p.fwd_ms + p.bwd_ms + comm + p.dp_ms,
            }
            for key, value in figures.items():
                rows[r].setdefault(key, []).append(value)
    return [{k: statistics.median(v) for k, v in row.items()} for row in rows]


MODEL_NAMES = {"checkpoint": "as planned", "updated": "after learning from the job"}


def build_report(
    profiles: Sequence[Sequence[StepProfile]],
    prediction: Any,
    tables: Sequence[Sequence[str]],
    model: str,
) -> dict[str, Any]:
    """The report (``error`` is ``predicted / measured - 1``).

    Args:
        profiles: every rank's sampled steps.
        prediction: the planner's ``PlanPrediction`` of the observed plan.
        tables: the tables (shards) each rank holds.
        model: ``"checkpoint"`` (the network as planned) or ``"updated"`` (after learning).
    """
    measured = measured_by_rank(profiles)
    ranks = []
    for r, m in enumerate(measured):
        predicted = {
            "fwd_ms": prediction.fwd_ms[r],
            "bwd_ms": prediction.bwd_ms[r],
            "comm_ms": prediction.comm_ms[r],
            "other_ms": prediction.other_ms[r],
        }
        total = prediction.total_ms(r)
        measured_ms = m.get("embedding_ms", float("nan"))
        ranks.append(
            {
                "rank": r,
                "predicted_ms": total,
                "measured_ms": measured_ms,
                "error": total / measured_ms - 1 if measured_ms > 0 else None,
                "predicted": predicted,
                "measured": m,
                "tables": list(tables[r]),
            }
        )
    steps = min((len(p) for p in profiles), default=0)
    return {
        "ranks": ranks,
        "bound_rank": _argmax([r["measured_ms"] for r in ranks]) if steps else None,
        "predicted_bound_rank": _argmax([r["predicted_ms"] for r in ranks]),
        "steps_observed": steps,
        "model": model,
    }


def rank_tables(plan: Any, world: int) -> list[list[str]]:
    """The tables (``module.table``) each rank holds in ``plan``."""
    out: list[list[str]] = [[] for _ in range(world)]
    for module, shardings in plan.plan.items():
        for name, ps in shardings.items():
            for rank in sorted(set(ps.ranks or range(world))):
                out[rank].append(f"{module}.{name}")
    return out


def _argmax(values: Sequence[float]) -> int:
    return max(range(len(values)), key=lambda i: values[i])


def check_report(data: Any, where: str) -> dict[str, Any]:
    """``data`` if it has the report's shape, else a ``ValueError`` naming ``where``."""
    need = {"ranks", "bound_rank", "predicted_bound_rank", "steps_observed", "model"}
    if not isinstance(data, dict) or not need <= set(data):
        found = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{where}: not an observer report (needs {sorted(need)}, got {found})")
    rank_keys = {"rank", "predicted_ms", "measured_ms", "error", "measured", "tables"}
    for i, r in enumerate(data["ranks"]):
        if not isinstance(r, dict) or not rank_keys <= set(r):
            raise ValueError(f"{where}: ranks[{i}] needs {sorted(rank_keys)}")
    return data


def report_lines(report: dict[str, Any]) -> list[str]:
    """The report as a table, like TorchRec's planner stats."""
    head = (
        f"DreamShard: predicted ({MODEL_NAMES.get(report['model'], report['model'])}) "
        "against measured per rank, "
        f"{report['steps_observed']} sampled steps (ms; embedding = fwd + bwd + comm + dp)"
    )
    lines = [
        head,
        "rank  tables  predicted  measured   error    fwd    bwd   comm   wait     dp   rest",
    ]
    for r in report["ranks"]:
        m = r["measured"]
        error = "-" if r["error"] is None else f"{r['error']:+.0%}"
        lines.append(
            f"{r['rank']:>4}  {len(r['tables']):>6}  {r['predicted_ms']:>9.2f}  "
            f"{r['measured_ms']:>8.2f}  {error:>6}  {m.get('fwd_ms', 0):>5.2f}  "
            f"{m.get('bwd_ms', 0):>5.2f}  {m.get('comm_ms', 0):>5.2f}  "
            f"{m.get('comm_wait_ms', 0):>5.2f}  {m.get('dp_ms', 0):>5.2f}  "
            f"{m.get('rest_ms', 0):>5.2f}"
        )
    lines.append(
        f"bounds the step: rank {report['bound_rank']} measured, "
        f"rank {report['predicted_bound_rank']} predicted"
    )
    inputs = report.get("inputs")
    if inputs and inputs.get("mispriced"):
        lines.append(input_line(inputs))
    if report.get("replan"):
        lines.append(f"re-plan: {report['replan']['why']}")
    if report.get("memory"):
        lines.extend(memory_lines(report["memory"]))
    observer = report.get("observer")
    if observer:
        lines.append(
            f"observing: one step in {observer['interval']} sampled, costing "
            f"{observer['overhead']:.2%} of the job's time (the worst rank)"
        )
    return lines


def input_line(inputs: dict[str, Any], shown: int = 4) -> str:
    """The tables the job fed other than the planner was told, the farthest first."""
    tables = {t["table"]: t for t in inputs["tables"]}
    off = sorted(
        (tables[name] for name in inputs["mispriced"]),
        key=lambda t: -abs(math.log(max(t["observed_pooling"], 1e-9) / t["declared_pooling"])),
    )
    listed = ", ".join(
        f"{t['table']} {t['declared_pooling']:g} -> {t['observed_pooling']:.3g}"
        for t in off[:shown]
    )
    more = f" and {len(off) - shown} more" if len(off) > shown else ""
    return (
        f"fed other than declared (ids per sample, declared -> fed): {listed}{more}; "
        "replan() plans with what was fed"
    )


def plot_memory(ax: Any, memory: dict[str, Any]) -> None:
    """Per-rank memory bars: estimate, measured parts stacked, peak and cap."""
    ranks = memory["ranks"]
    x = list(range(len(ranks)))
    bottom = [0.0] * len(ranks)
    for part in ("weights", "optimizer", "buffers"):
        heights = [sum(t["measured"][part] for t in r["tables"]) / 2**20 for r in ranks]
        ax.bar([i - 0.2 for i in x], heights, 0.4, bottom=bottom, label=f"measured {part}")
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.bar([i + 0.2 for i in x], [r["predicted"] / 2**20 for r in ranks], 0.4, label="predicted")
    ax.scatter(x, [r["peak"] / 2**20 for r in ranks], marker="_", s=400, c="k", label="peak")
    caps = [r["cap"] / 2**20 for r in ranks if r["cap"]]
    if caps:
        ax.scatter(x, caps, marker="_", s=400, c="r", label="cap")
    ax.set_xticks(x, [f"rank {r['rank']}" for r in ranks])
    ax.set_ylabel("MiB")
    ax.legend(fontsize=7)


def plot_report(report: dict[str, Any], path: str) -> None:
    """Per-rank bars of predicted against measured (and memory in a second panel)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = report["ranks"]
    x = range(len(ranks))
    memory = report.get("memory")
    panels = 2 if memory else 1
    fig, axes = plt.subplots(1, panels, figsize=(panels * max(4, 1.2 * len(ranks) + 2), 3.5))
    ax = axes[0] if memory else axes
    if memory:
        plot_memory(axes[1], memory)
    bottom = [0.0] * len(ranks)
    parts = (("fwd_ms", "fwd"), ("bwd_ms", "bwd"), ("comm_ms", "comm"), ("dp_ms", "dp"))
    for key, label in parts:
        heights = [r["measured"].get(key, 0.0) for r in ranks]
        ax.bar([i - 0.2 for i in x], heights, 0.4, bottom=bottom, label=f"measured {label}")
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    predicted = [r["predicted_ms"] for r in ranks]
    ax.bar([i + 0.2 for i in x], predicted, 0.4, label=f"predicted ({report['model']})")
    ax.set_xticks(list(x), [f"rank {r['rank']}" for r in ranks])
    ax.set_ylabel("embedding ms per step")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
