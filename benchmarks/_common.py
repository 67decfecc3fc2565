"""What every benchmark shares: where results go, the machine they were taken on, and how
they are written (raw JSON beside a Markdown summary)."""

from __future__ import annotations

import json
import os
import platform
import time

import torch
from _paths import RESULTS  # noqa: F401 (re-exported)


def load_note() -> str:
    """How busy the machine was, from the load average at the time of writing."""
    one, five, fifteen = os.getloadavg()
    cores = os.cpu_count() or 1
    busy = five > 0.75 * cores
    return (
        f"Load average at the end: {one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min) on "
        f"{cores} cores: "
        + (
            "other work shared the machine while this ran, so its timings carry that noise "
            "(plans are compared in interleaved rounds, and the spread is reported)."
            if busy
            else "the machine was otherwise quiet."
        )
    )


def machine() -> dict:
    """The hardware fingerprint the measurements record, plus the platform and load."""
    from torchrec_dreamshard.measure import MeasureConfig, hardware_fingerprint

    return {
        **hardware_fingerprint(MeasureConfig()),
        "platform": platform.platform(),
        "load_average": os.getloadavg(),
        "torch_threads_default": torch.get_num_threads(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "note": load_note(),
    }


def write(name: str, data: dict, summary: str) -> None:
    """``results/NAME.json`` (raw) and ``results/NAME.md`` (the summary), and print it."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    (RESULTS / f"{name}.md").write_text(summary.rstrip() + "\n")
    print(summary)
