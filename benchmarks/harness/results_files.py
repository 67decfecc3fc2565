"""Where the benchmarks' results go and how they are written: raw JSON beside a Markdown
summary, the machine they were taken on, and the raw file a resumable run reads back.

``RESULTS`` is ``benchmarks/results/``, beside this harness (the benchmarks run from a
checkout; nothing else writes there).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"


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


def git(*args: str) -> str:
    """What ``git ARGS`` prints in the checkout the benchmarks run from ('' outside one)."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=RESULTS.parent, capture_output=True, text=True, check=False
        )
    except OSError:  # no git on this machine
        return ""
    return done.stdout.strip()


def machine() -> dict:
    """The hardware fingerprint the measurements record, plus the platform and load."""
    import torch

    from torchrec_dreamshard.measure import MeasureConfig, hardware_fingerprint

    return {
        **hardware_fingerprint(MeasureConfig()),
        "platform": platform.platform(),
        "load_average": os.getloadavg(),
        "torch_threads_default": torch.get_num_threads(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "commit": git("rev-parse", "HEAD"),
        "note": load_note(),
    }


def write(name: str, data: dict, summary: str) -> None:
    """``RESULTS/NAME.json`` (raw) and ``RESULTS/NAME.md`` (the summary), and print it."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    (RESULTS / f"{name}.md").write_text(summary.rstrip() + "\n")
    print(summary)


def load_raw(path: Path, settings: dict) -> dict:
    """The raw results an earlier run with the same ``settings`` saved at ``path``, else
    a fresh ``{"settings": settings, "tasks": []}`` (said on stdout when the file holds
    other settings)."""
    if path.exists():
        raw = json.loads(path.read_text())
        if raw.get("settings") == settings:
            return raw
        print(f"{path.name} holds other settings; starting afresh", flush=True)
    return {"settings": settings, "tasks": []}


def save_raw(path: Path, raw: dict) -> None:
    """Write ``raw`` to ``path`` atomically (a temporary file, then a rename), so that an
    interrupted run leaves the previous file whole."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(raw) + "\n")
    os.replace(tmp, path)
