"""How ``dreamshard plan`` shows a plan: the per-device table and plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def format_plan(plan: dict[str, Any]) -> str:
    """A per-device table of a summary (``other ms``: TorchRec's estimate of its tables)."""
    from torchrec_dreamshard.device_report import device_table

    rows = [{**dev, "tables": len(dev["tables"])} for dev in plan["per_device"]]
    figures = ("fwd_ms", "bwd_ms", "comm_ms")
    if any(dev.get("other_ms") for dev in plan["per_device"]):
        figures += ("other_ms",)
    lines = device_table(rows, figures=figures, memory=True)
    lines.append(f"predicted step cost: {plan['predicted_cost_ms']:.3f} ms")
    return "\n".join(lines)


def check_plot_format(path: str | Path) -> None:
    """Refuse a plot file name whose suffix matplotlib cannot write (before planning)."""
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(path).suffix.lstrip(".").lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix and suffix not in formats:
        raise ValueError(
            f"--plot file {str(path)!r}: matplotlib cannot write {suffix!r} files; use one of "
            f"{sorted(formats)}"
        )


def plot_per_device(per_device: Sequence[dict[str, Any]], path: str | Path, title: str) -> None:
    """Stacked per-device bars (forward, backward, comm, other) written to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = [d["device"] for d in per_device]
    fwd = [d["fwd_ms"] for d in per_device]
    bwd = [d["bwd_ms"] for d in per_device]
    comm = [d["comm_ms"] for d in per_device]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.5 * len(devices) + 2), 4.0))
    ax.bar(devices, fwd, label="forward")
    ax.bar(devices, bwd, bottom=fwd, label="backward")
    below = [f + b for f, b in zip(fwd, bwd, strict=True)]
    ax.bar(devices, comm, bottom=below, label="comm")
    other = [d.get("other_ms", 0.0) for d in per_device]
    if any(other):
        below = [x + c for x, c in zip(below, comm, strict=True)]
        ax.bar(devices, other, bottom=below, label="other (TorchRec's estimate)")
    ax.set_xlabel("device")
    ax.set_ylabel("ms")
    ax.set_title(title)
    ax.set_xticks(devices)
    ax.legend(
        loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4 if any(other) else 3, frameon=False
    )
    fig.tight_layout()
    from torchrec_dreamshard.io import save_figure

    save_figure(fig, path, "plot file", dpi=120)
