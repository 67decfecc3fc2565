"""The run's metrics: ``metrics.csv`` and a PNG of the curves."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from torchrec_dreamshard.io import atomic_write_with, save_figure

METRICS_NAME = "metrics.csv"
PLOT_NAME = "curves.png"


def write_metrics(out_dir: Path, row: dict[str, float]) -> None:
    """Append ``row`` to metrics.csv (the header grows with new keys) and redraw curves."""
    path = out_dir / METRICS_NAME
    rows = list(csv.DictReader(path.open())) if path.exists() else []
    rows.append({k: str(v) for k, v in row.items()})
    keys = list(dict.fromkeys(k for r in rows for k in r))

    def write(f) -> None:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)

    atomic_write_with(path, write, "metrics file")
    plot_curves(path, out_dir / PLOT_NAME)


def plot_curves(metrics_csv: Path, out_png: Path) -> None:
    """One panel per metric against the iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(csv.DictReader(Path(metrics_csv).open()))
    keys = [k for k in rows[0] if k != "iteration"] if rows else []
    if not keys:
        return
    cols = 3
    fig, axes = plt.subplots(
        math.ceil(len(keys) / cols), cols, figsize=(12, 2.6 * math.ceil(len(keys) / cols))
    )
    for ax, key in zip(np.ravel(axes), keys, strict=False):
        pts = [(float(r["iteration"]), float(r[key])) for r in rows if r.get(key) not in ("", None)]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("iteration", fontsize=8)
    for ax in np.ravel(axes)[len(keys) :]:
        ax.axis("off")
    fig.tight_layout()
    save_figure(fig, out_png, "curves file", dpi=80)
