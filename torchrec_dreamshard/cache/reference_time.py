"""This machine's time on the reference kernel, measured once and cached per machine
(:func:`load_reference_ms`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torchrec_dreamshard.cache.machine_cache import (
    CacheFile,
    load_cached,
    loaded_memo,
    machine_cache_file,
    named_file,
)
from torchrec_dreamshard.measure import reference_speed
from torchrec_dreamshard.measure.hardware import cpu_name

FORMAT_VERSION = 1


def reference_cache_file(device: str = "cpu") -> CacheFile:
    """This machine's cache file of the reference kernel on ``device``."""
    return machine_cache_file("reference_kernel", device, device, format=FORMAT_VERSION)


def default_reference_path(device: str = "cpu") -> Path:
    """Where :func:`reference_cache_file` is."""
    return reference_cache_file(device).path


_LOADED: dict[str, tuple[float, float]] = loaded_memo()


def _parse(data: Any) -> tuple[float, float]:
    try:
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"format version {data.get('version')!r}")
        ms = (float(data["fwd_ms"]), float(data["bwd_ms"]))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed ({exc})") from None
    if not (ms[0] > 0 and ms[1] > 0):
        raise ValueError(f"malformed (times {ms} are not positive)")
    return ms


def load_reference_ms(
    path: str | os.PathLike | None = None, device: str = "cpu"
) -> tuple[float, float]:
    """The reference kernel's ``(fwd_ms, bwd_ms)`` here, from ``path`` (default
    :func:`default_reference_path`), measured and saved first where missing."""
    file = named_file(path) if path is not None else reference_cache_file(device)

    def dump(ms: tuple[float, float]) -> dict[str, Any]:
        where = cpu_name() if device == "cpu" else device
        return {"version": FORMAT_VERSION, "fwd_ms": ms[0], "bwd_ms": ms[1], "source": where}

    measure = lambda: reference_speed.measure_reference_ms(device)  # noqa: E731 - late-bound
    return load_cached(file, "reference kernel file", _parse, measure, dump, _LOADED)
