"""The calibration store's keys: where the store lives and the job key of each kernel (by
machine, workload and its tables' content, so a second calibration measures nothing)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchrec_dreamshard.cache.location import cache_dir_override, cache_root
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.measure.config import MeasureConfig, stable_key

STORE_ENV = "DREAMSHARD_CALIBRATION_STORE"  # overrides the default store path
STORE_NAME = "calibration.sqlite"  # the store's file in the cache directory
JOB_ROOT = "calib"


def default_store_path() -> Path:
    """``calibration.sqlite`` in a ``using_cache_dir`` block's directory, else
    ``$DREAMSHARD_CALIBRATION_STORE``, else ``calibration.sqlite`` in :func:`cache_root`."""
    if cache_dir_override() is None:
        env = os.environ.get(STORE_ENV)
        if env:
            return Path(env)
    return cache_root() / STORE_NAME


def table_signature(table: TableSpec) -> str:
    """A short hash of everything that defines a table's kernel but its name."""
    data = table.to_dict()
    data.pop("name")
    return stable_key(data)


def kernel_job(prefix: str, tables: Sequence[TableSpec]) -> str:
    """The store's job key of one fused kernel over ``tables`` (order-free)."""
    sigs = sorted(table_signature(t) for t in tables)
    if len(sigs) == 1:
        return f"{prefix}t-{sigs[0]}"
    return f"{prefix}g{len(sigs)}-{stable_key(sigs, 16)}"


def job_prefix(store: Any, config: MeasureConfig, batch_size: int) -> str:
    """``calib/<fingerprint>/<workload>/``: this machine's and workload's kernels."""
    from torchrec_dreamshard.measure.hardware import fingerprint_key

    fp = fingerprint_key(store.fingerprint(config, "local"))
    return f"{JOB_ROOT}/{fp}/{config.workload_key(batch_size)}/"
