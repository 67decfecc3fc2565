"""What the planner's cache holds, and clearing it (``dreamshard cache``): only the files the
package names are listed or removed, and a store ``$DREAMSHARD_CALIBRATION_STORE`` names
outside the cache directory is listed, never removed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from torchrec_dreamshard.cache.location import cache_root, cache_root_source
from torchrec_dreamshard.cache.machine_cache import (
    CACHE_FORMAT,
    ENVELOPE,
    forget_loaded,
    is_envelope,
    measurement_key,
)
from torchrec_dreamshard.cache.store_keys import STORE_ENV, STORE_NAME, default_store_path
from torchrec_dreamshard.io import read_json
from torchrec_dreamshard.store.cost_store import CostStore
from torchrec_dreamshard.store.fed_inputs_store import count_inputs, forget_inputs

# What each kind holds; ``dreamshard cache --clear KIND`` takes these names.
KINDS = {
    "reference_kernel": "the reference kernel's time",
    "dense_kernel": "the dense kernel's fitted model",
    "sharding_path": "a sharding path's measured step cost",
    "collectives": "the collectives' fitted models",
    "verification": "a verification's measured rounds",
    "calibration": "a calibration store: measured kernels, what jobs fed their tables",
    "fed_inputs": "what running jobs fed their tables (rows of the calibration store)",
}
# File-name prefixes of the machine cache files, by kind (comm_model_: an older version's
# all-to-all model, never read now).
_PREFIXES = {
    "reference_kernel_": "reference_kernel",
    "dense_kernel_": "dense_kernel",
    "sharding_path_": "sharding_path",
    "collectives_": "collectives",
    "comm_model_": "collectives",
    "verification_": "verification",
}
_STORE_SIDECARS = ("-wal", "-shm", "-journal", ".lock")
_MACHINE_FIELDS = ("host", "device_name", "threads", "torch", "fbgemm_gpu")


@dataclass(frozen=True)
class CachedItem:
    """One thing the cache holds.

    Attributes:
        kind: one of :data:`KINDS` (``"calibration"`` for a store).
        files: its files (a store's write-ahead log and lock beside it).
        size: bytes, its files together.
        modified: when it was last written (seconds since the epoch).
        key: what it was measured on (``None``: a store, or a file that records no key).
        notes: what else to say of it, in lines.
        removable: inside the cache directory (``--clear`` removes it).
    """

    kind: str
    path: Path
    files: tuple[Path, ...]
    size: int
    modified: float
    key: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()
    removable: bool = True


def _stat(files: tuple[Path, ...]) -> tuple[int, float]:
    """Bytes and the newest modification time of ``files`` (one gone counts nothing)."""
    stats = []
    for f in files:
        try:
            stats.append(f.stat())
        except FileNotFoundError:
            continue
    return sum(s.st_size for s in stats), max((s.st_mtime for s in stats), default=0.0)


def _file_kind(path: Path) -> str | None:
    """The kind of a machine cache file by its name (``None``: not the package's)."""
    if path.suffix != ".json":
        return None
    return next((k for p, k in _PREFIXES.items() if path.name.startswith(p)), None)


def machine_file_item(path: Path, kind: str) -> CachedItem:
    """A machine cache file as a :class:`CachedItem` (one not read says why in its notes)."""
    size, modified = _stat((path,))
    try:
        data = read_json(path, "cache file")
    except ValueError as exc:
        return CachedItem(kind, path, (path,), size, modified, notes=(f"unreadable: {exc}",))
    if not is_envelope(data):
        note = "records no key (an older version's file, or written by hand)"
        return CachedItem(kind, path, (path,), size, modified, notes=(note,))
    if data[ENVELOPE] != CACHE_FORMAT or not isinstance(data.get("key"), dict):
        note = f"cache format {data[ENVELOPE]!r}, this version reads {CACHE_FORMAT}: not read"
        return CachedItem(kind, path, (path,), size, modified, notes=(note,))
    return CachedItem(kind, path, (path,), size, modified, key=data["key"])


def store_item(path: Path, removable: bool) -> CachedItem:
    """A calibration store as a :class:`CachedItem`, its rows in the notes."""
    files = (path, *(p for s in _STORE_SIDECARS if (p := Path(f"{path}{s}")).exists()))
    size, modified = _stat(files)
    try:
        notes = store_lines(path)
    except ValueError as exc:
        notes = [f"unreadable: {exc}"]
    if not removable:
        notes.append(f"named by ${STORE_ENV} outside the cache directory: never cleared")
    return CachedItem("calibration", path, files, size, modified, None, tuple(notes), removable)


def store_lines(path: Path) -> list[str]:
    """A store's kernel rows per hardware fingerprint, and its tables' fed inputs.

    Raises:
        ValueError: the file is not a usable cost store.
    """
    with CostStore(path) as store:
        groups = store.groups()
    by_hardware: dict[str, dict[str, Any]] = {}
    for g in groups:
        h = by_hardware.setdefault(g["fingerprint"], {"hw": g["hardware"], "rows": 0, "w": 0})
        h["rows"] += g["rows"]
        h["w"] += 1
    lines = [
        f"{h['rows']} measured rows in {h['w']} workload(s) on {_hardware_words(h['hw'])}"
        for h in by_hardware.values()
    ]
    fed = count_inputs(path)
    if fed:
        lines.append(f"{fed} tables' fed inputs")
    return lines or ["empty"]


def _hardware_words(hw: dict[str, Any]) -> str:
    return (
        f"{hw.get('device_name')} ({hw.get('device')}), {hw.get('threads_per_device')} "
        f"thread(s) per device, torch {hw.get('torch')}, FBGEMM {hw.get('fbgemm_gpu')}"
    )


def cache_items() -> list[CachedItem]:
    """The machine cache files and stores in the cache directory, and the calibration store
    wherever the environment puts it."""
    root = cache_root()
    items = []
    if root.is_dir():
        for path in sorted(root.iterdir()):
            kind = _file_kind(path)
            if kind is not None and path.is_file():
                items.append(machine_file_item(path, kind))
            elif _is_store_name(path) and path.is_file():
                items.append(store_item(path, removable=True))
    store = default_store_path()
    if store.is_file() and store.resolve() not in {i.path.resolve() for i in items}:
        inside = root.is_dir() and store.resolve().parent == root.resolve()
        items.append(store_item(store, removable=inside))
    return items


def _is_store_name(path: Path) -> bool:
    """Whether ``path`` is the calibration store or a benchmark's (``bench_*.sqlite``); no
    other SQLite file is opened, as opening adds the store's tables to it."""
    return path.name == STORE_NAME or (path.name.startswith("bench_") and path.suffix == ".sqlite")


def other_files(items: list[CachedItem]) -> list[Path]:
    """Files in the cache directory that are none of ``items``' (not the package's)."""
    root = cache_root()
    if not root.is_dir():
        return []
    ours = {f for item in items for f in item.files}
    return [p for p in sorted(root.iterdir()) if p not in ours]


def key_differences(key: dict[str, Any], here: dict[str, dict[str, Any] | None]) -> list[str]:
    """What of ``key``'s machine part differs from this machine now, in words; ``here``
    caches this machine's keys by device type."""
    device = str(key.get("device", "cpu"))
    if device not in here:
        present = device == "cpu" or (device == "cuda" and torch.cuda.is_available())
        here[device] = measurement_key(device) if present else None
    now = here[device]
    if now is None:
        return [f"no {device} device here"]
    return [
        f"{field} {key.get(field)!r} (here {now[field]!r})"
        for field in _MACHINE_FIELDS
        if key.get(field) != now[field]
    ]


def clear_cache(kind: str = "all") -> list[str]:
    """Remove what the cache directory holds of ``kind`` (one of :data:`KINDS`, or
    ``"all"``), a line per item, and forget the values this process loaded from it.

    Raises:
        ValueError: ``kind`` is not one of :data:`KINDS` nor ``"all"``.
    """
    if kind != "all" and kind not in KINDS:
        raise ValueError(f"unknown cache kind {kind!r}; one of all, {', '.join(KINDS)}")
    removed = []
    for item in cache_items():
        if not item.removable:
            continue
        if kind == "fed_inputs" and item.kind == "calibration":
            n = forget_inputs(item.path)
            removed += [f"forgot {n} tables' fed inputs in {item.path.name}"] if n else []
        elif kind in ("all", item.kind):
            for f in item.files:
                f.unlink(missing_ok=True)
            removed.append(f"removed {item.path.name} ({item.kind}, {size_words(item.size)})")
    forget_loaded()
    return removed


def size_words(size: int) -> str:
    """``size`` bytes, in B, KB, MB or GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def age_words(seconds: float) -> str:
    """An age in s, min, h or days."""
    for unit, scale in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= scale:
            return f"{seconds / scale:.1f} {unit}"
    return f"{max(seconds, 0):.0f} s"


def key_words(key: dict[str, Any]) -> str:
    """A key on one line: its fields as ``name=value``."""
    return " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in key.items())


def inventory_lines(items: list[CachedItem], now: float) -> list[str]:
    """The cache directory, this machine's key, and every item with its kind, size, age at
    ``now`` (seconds since the epoch), key and notes."""
    here: dict[str, dict[str, Any] | None] = {}
    lines = [f"cache directory: {cache_root()} (from {cache_root_source()})"]
    lines.append(f"this machine now: {key_words(measurement_key('cpu'))}")
    if not items:
        return [*lines, "the cache is empty"]
    for item in items:
        age = age_words(now - item.modified)
        lines.append(f"{item.kind}: {item.path.name}  {size_words(item.size)}, {age} old")
        if item.kind != "calibration":
            lines.append(f"    {KINDS[item.kind]}")
        if item.key is not None:
            lines.append(f"    key: {key_words(item.key)}")
            differs = key_differences(item.key, here)
            where = "differs from here: " + "; ".join(differs) if differs else "this machine"
            lines.append(f"    measured on {where}")
        lines += [f"    {note}" for note in item.notes]
    total = sum(item.size for item in items)
    lines.append(f"{len(items)} item(s), {size_words(total)}")
    return lines
