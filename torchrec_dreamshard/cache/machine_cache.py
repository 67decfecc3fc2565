"""Per-machine cache files of what is measured once and reused (:class:`CacheFile`), keyed by
everything that changes the measurement (:func:`measurement_key`), the key kept beside the
value so a file measured under another is not found; :func:`load_cached` reads or measures."""

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
    """What changes a measurement on ``device`` here: host, device type and model, the
    timers' intra-op threads, torch and FBGEMM versions."""
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

    Attributes:
        kind: what it holds (``"reference_kernel"``...); empty for a file the caller named.
        key: what the value was measured on, kept in the file's envelope and checked when
            read; ``None`` for a file the caller named, plain JSON.
    """

    path: Path
    kind: str = ""
    key: dict[str, Any] | None = None


def machine_cache_file(kind: str, device: str = "cpu", label: str = "", **extra: Any) -> CacheFile:
    """``<kind>_<label>_<digest>.json`` in the cache directory, keyed by
    :func:`measurement_key` on ``device`` and ``extra`` (JSON-able)."""
    key = {**measurement_key(device), **extra}
    key = json.loads(json.dumps(key))  # as it reads back from the file
    digest = stable_key(key, KEY_LENGTH)
    name = "_".join(part for part in (kind, label, digest) if part) + ".json"
    return CacheFile(cache_root() / name, kind, key)


def named_file(path: str | Path) -> CacheFile:
    """A file the caller named: plain JSON, read whatever key it holds."""
    return CacheFile(Path(path))


def is_envelope(data: Any) -> bool:
    """Whether ``data`` is an envelope: ``{"dreamshard_cache": format, "kind", "key", "value"}``."""
    return isinstance(data, dict) and ENVELOPE in data


def read_cached_data(file: CacheFile, what: str) -> Any | None:
    """The value ``file`` holds (JSON; a plain file is the value), or ``None``: missing, or
    an envelope of another format or key.

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
    """Write ``value`` (JSON-able) to ``file`` atomically, in an envelope where it has a key."""
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
    """Forget every value a memo of :func:`loaded_memo` remembers."""
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
    """``parse`` of ``file``'s JSON, or ``measure()`` written there first (as ``dump`` of it);
    either kept in ``memo`` by path.

    Raises:
        ValueError: the file is not valid JSON or ``parse`` refuses it.
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
