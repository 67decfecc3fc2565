"""A task file's fields beside its tables: their bounds, the batch's names (the global
``global_batch_size``; ``batch_size`` its older name), the per-rank batch rule
(:func:`per_rank_batch`) and the cluster's fields."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from torchrec_dreamshard.data.tables import short_repr

# Upper bounds of a task's fields (see the README's "Limits and errors").
MAX_DEVICES = 4096  # devices D
MAX_BATCH_SIZE = 2**24  # global batch (samples)
MAX_MEMORY_BYTES = 2**50  # per device (1 PiB)
MAX_TABLES = 100_000  # tables in one task

COMPUTE_DEVICES = ("cpu", "cuda")  # what a task's devices may be
CLUSTER_KEYS = {"compute_device", "hosts", "local_world_size"}  # a task file's, optional
GLOBAL_BATCH_KEY = "global_batch_size"  # a task file's batch: samples over all devices
OLD_BATCH_KEY = "batch_size"  # its older name, still read (with a warning from Task.load)


def cluster_devices(data: Mapping[str, Any]) -> Any:
    """A task file's device count: ``num_devices``, or ``hosts * local_world_size``
    (both given: they must agree; a ``ValueError`` otherwise)."""
    hosts, local = data.get("hosts"), data.get("local_world_size")
    if hosts is None:
        return data.get("num_devices")  # missing: named with the other missing fields
    if local is None:
        raise ValueError("task gives 'hosts' without 'local_world_size' (devices per host)")
    hosts = bounded_int("hosts", hosts, MAX_DEVICES)
    local = bounded_int("local_world_size", local, MAX_DEVICES)
    given = data.get("num_devices")
    if given is not None and given != hosts * local:
        raise ValueError(
            f"num_devices {short_repr(given)} is not hosts {hosts} x local_world_size {local} "
            f"= {hosts * local}: give num_devices or hosts and local_world_size"
        )
    return hosts * local


def warn_old_batch_key(data: Any, path: str | Path) -> None:
    """Warn (``DeprecationWarning``, one line) where the task file ``path`` names its
    global batch ``batch_size``, the older key: TorchRec's ``batch_size`` is per rank."""
    items = data if isinstance(data, list) else [data]
    if any(isinstance(d, Mapping) and OLD_BATCH_KEY in d for d in items):
        warnings.warn(
            f"task file {str(path)!r}: 'batch_size' is deprecated, rename it "
            f"'{GLOBAL_BATCH_KEY}' (the global batch; TorchRec's batch_size is per rank)",
            DeprecationWarning,
            stacklevel=3,
        )


def per_rank_batch(global_batch: int, world_size: int) -> int:
    """TorchRec's per-rank ``batch_size``: ``global_batch // world_size``; a ``ValueError``
    naming the nearest multiples where it does not divide evenly."""
    if world_size < 1:
        raise ValueError(f"world_size must be positive, got {world_size}")
    if global_batch % world_size:
        low = global_batch - global_batch % world_size
        raise ValueError(
            f"{GLOBAL_BATCH_KEY} {global_batch} (the global batch) must divide evenly among "
            f"its ranks, num_devices {world_size}: TorchRec plans a per-rank batch; use a "
            f"multiple of {world_size}, such as {max(low, world_size)} or {low + world_size}"
        )
    return global_batch // world_size


def bounded_int(what: str, value: Any, high: int, whole_floats: bool = False) -> int:
    """``value`` as an int in ``1..high`` (floats only when whole and ``whole_floats``); a
    ``ValueError`` naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(f"{what} must be an integer, got {short_repr(value)}")
    if isinstance(value, float | np.floating):
        if not (whole_floats and math.isfinite(value) and float(value).is_integer()):
            raise ValueError(f"{what} must be a whole number, got {short_repr(value)}")
        value = int(value)
    if value < 1:
        raise ValueError(f"{what} must be positive (1..{high}), got {short_repr(value)}")
    if value > high:
        raise ValueError(f"{what} must be at most {high}, got {short_repr(value)}")
    return int(value)
