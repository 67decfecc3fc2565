"""Per-machine cache files of what is measured once on a machine and reused (the fitted
collective models, the dense kernel's model, the reference kernel's time, a verification's
rounds), and the key each is found by.

The key (:func:`measurement_key`) is everything that changes a measurement: the host, the
device and its model (the CPU's or the GPU's), the intra-op threads the timers run on
(:func:`~torchrec_dreamshard.measure.hardware.measuring_threads`), the torch and FBGEMM
versions; a kind of file adds what changes it further (the collectives: the backend and the
topology; a verification: the task, the plans and the settings). A cache file
(:class:`CacheFile`) lives in :func:`~torchrec_dreamshard.cache.location.cache_root`,
named for its kind and a short digest of its key, and holds the key in full beside the value
(its *envelope*), so that a file measured under another key is simply not found (another
machine, thread count, torch or FBGEMM version or topology measures afresh) and ``dreamshard
cache`` can show what each file was measured on. Older versions' files (other names, no
envelope) are never looked up.

:func:`load_cached` reads a file, or measures and writes it (atomically: two first runs may
measure at once, the last rename wins and both files are whole), and remembers the value per
path for the rest of the process (:func:`forget_loaded` forgets every remembered value).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from torchrec_dreamshard.cache.location import cache_root
from torchrec_dreamshard.io import atomic_write, dumps_strict, read_json
from torchrec_dreamshard.measure import hardware
from torchrec_dreamshard.measure.config import stable_key

T = TypeVar("T")

CACHE_FORMAT = 1  # of the envelope; a file of another format is not read (measured again)
ENVELOPE = "dreamshard_cache"  # the envelope's marker: its value is the format
KEY_LENGTH = 12  # hex digits of the key's digest in a file name


def measurement_key(device: str = "cpu") -> dict[str, Any]:
    """What changes a measurement on ``device`` here: ``host``, ``device`` (its type),
    ``device_name`` (the CPU or GPU model), ``threads`` (the intra-op threads the timers
    run on), ``torch`` and ``fbgemm_gpu`` (the versions)."""
    return {
        "host": socket.gethostname(),
        "device": torch.device(device).type,
        "device_name": hardware.device_name(device),
        "threads": hardware.measuring_threads(device),
        "torch": torch.__version__,
        "fbgemm_gpu": hardware.fbgemm_version(),
    }


@dataclass(frozen=True)
class CacheFile:
    """Where a cached value is kept, and under which key.

    Args:
        path: the file.
        kind: what it holds (``"reference_kernel"``, ``"collectives"``...); empty for a
            file the caller named.
        key: what the value was measured on (:func:`measurement_key` and the kind's own
            parts), written in the file's envelope and checked when it is read; ``None``
            for a file the caller named, which holds the value as plain JSON.
    """

    path: Path
    kind: str = ""
    key: dict[str, Any] | None = None


def machine_cache_file(kind: str, device: str = "cpu", label: str = "", **extra: Any) -> CacheFile:
    """The cache file of ``kind`` measured on ``device`` here, keyed by
    :func:`measurement_key` and ``extra`` (JSON-able): ``<kind>_<label>_<digest>.json`` in
    the cache directory (``label``, optional, is for people reading the folder)."""
    key = {**measurement_key(device), **extra}
    key = json.loads(json.dumps(key))  # as it reads back from the file
    digest = stable_key(key, KEY_LENGTH)
    name = "_".join(part for part in (kind, label, digest) if part) + ".json"
    return CacheFile(cache_root() / name, kind, key)


def named_file(path: str | Path) -> CacheFile:
    """A file the caller named: plain JSON, read whatever key it holds."""
    return CacheFile(Path(path))


def is_envelope(data: Any) -> bool:
    """Whether ``data`` (a cache file's JSON) is an envelope: ``{"dreamshard_cache": format,
    "kind", "key", "value"}``."""
    return isinstance(data, dict) and ENVELOPE in data


def read_cached_data(file: CacheFile, what: str) -> Any | None:
    """The value ``file`` holds (JSON), or ``None`` where there is none to read: the file
    is missing, or its envelope is of another format or holds another key.

    A plain (non-envelope) file is read as the value: a file the caller named, or one
    written by hand at a cache file's name. An envelope is unwrapped wherever it is found.

    Raises:
        ValueError: the file is not valid JSON (the message names it).
    """
    if not file.path.exists():
        return None
    data = read_json(file.path, what)
    if not is_envelope(data):
        return data
    if data[ENVELOPE] != CACHE_FORMAT or "value" not in data:
        return None
    if file.key is not None and data.get("key") != file.key:
        return None
    return data["value"]


def write_cached_data(file: CacheFile, value: Any, what: str) -> None:
    """Write ``value`` (JSON-able) to ``file``: in an envelope with the file's kind and key,
    or plain for a file the caller named (atomic; folders created)."""
    data = value
    if file.key is not None:
        data = {ENVELOPE: CACHE_FORMAT, "kind": file.kind, "key": file.key, "value": value}
    file.path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(file.path, dumps_strict(data), what)


_MEMOS: list[dict[str, Any]] = []


def loaded_memo() -> dict[str, Any]:
    """A new per-process memo of loaded values by path, forgotten by :func:`forget_loaded`."""
    memo: dict[str, Any] = {}
    _MEMOS.append(memo)
    return memo


def forget_loaded() -> None:
    """Forget every value a memo of :func:`loaded_memo` remembers (after the cache was
    cleared, the next load reads or measures again)."""
    for memo in _MEMOS:
        memo.clear()


def load_cached(
    file: CacheFile,
    what: str,
    parse: Callable[[Any], T],
    measure: Callable[[], T],
    dump: Callable[[T], Any],
    memo: dict[str, T],
) -> T:
    """The value in ``file`` (``parse`` of its JSON), or ``measure()`` written there first
    (as ``dump`` of it); either kept in ``memo`` by path.

    Raises:
        ValueError: the file is not valid JSON or ``parse`` refuses it (the message names
            the file and says to delete it to measure again).
    """
    key = str(file.path)
    if key in memo:
        return memo[key]
    try:
        data = read_cached_data(file, what)  # read_json's errors name the file
        value = None if data is None else parse(data)
    except ValueError as exc:
        text = str(exc) if key in str(exc) else f"{what} {key!r}: {exc}"
        raise ValueError(f"{text}; delete {key!r} to measure again") from None
    if data is None:
        value = measure()
        write_cached_data(file, dump(value), what)
    memo[key] = value
    return value
