"""The per-device table every command prints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

HEADERS = {"fwd_ms": "fwd ms", "bwd_ms": "bwd ms", "comm_ms": "comm ms", "other_ms": "other ms"}


def device_table(
    rows: Sequence[Mapping[str, Any]],
    figures: Sequence[str] = ("fwd_ms", "bwd_ms", "comm_ms"),
    label: str = "device",
    digits: int = 3,
    memory: bool = False,
) -> list[str]:
    """A header line, then one line per device: ``tables``, with ``memory`` the bytes used
    (``bytes`` of ``memory_bytes``), each of ``figures`` (ms) and their total."""
    head = f"{label:>6} {'tables':>6}" + (f" {'memory used':>16}" if memory else "")
    lines = [head + "".join(f" {HEADERS[k]:>9}" for k in figures) + f" {'total ms':>9}"]
    for i, row in enumerate(rows):
        line = f"{i:>6} {row['tables']:>6}"
        if memory:
            line += f" {row['bytes']:>10} ({row['bytes'] / row['memory_bytes']:4.0%})"
        values = [float(row[k]) for k in figures]
        line += "".join(f" {v:>9.{digits}f}" for v in values) + f" {sum(values):>9.{digits}f}"
        lines.append(line)
    return lines
