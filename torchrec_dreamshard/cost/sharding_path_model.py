"""The step cost of a sharding path beyond its kernels and collectives, timed on this
machine and cached; a typed plan pays it once per path it runs (not data-parallel).
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrec_dreamshard.cache.machine_cache import (
    CacheFile,
    load_cached,
    loaded_memo,
    machine_cache_file,
    named_file,
)
from torchrec_dreamshard.cost.collective_models import CollectiveModels, group_topology_key
from torchrec_dreamshard.cost.sharding import ID_BYTES, LENGTH_BYTES, OUTPUT_BYTES
from torchrec_dreamshard.measure.hardware import device_name
from torchrec_dreamshard.measure.sharding_path import PathTimings, time_sharding_path
from torchrec_dreamshard.measure.spent import spent_on
from torchrec_dreamshard.ranks.job_group import JobGroup, active_group

FORMAT_VERSION = 1  # of the cache file; a reader refuses other versions
_MAD_TO_STD = 1.4826  # a normal's standard deviation over its median absolute deviation
_MEDIAN_SE = 1.2533  # the median's standard error over the mean's, for a normal


@dataclass(frozen=True)
class ShardingPathModel:
    """What one sharding path costs a step (:meth:`unmodelled_ms`).

    Attributes:
        timings: the measurement it was fitted to.
        device: the device type it was timed on.
    """

    timings: PathTimings
    device: str = "cpu"
    source: str = ""

    @property
    def median_ms(self) -> float:
        """The median per-round difference (ms) of one table-wise path table over none."""
        return float(statistics.median(self.timings.deltas_ms))

    @property
    def error_ms(self) -> float:
        """The median's standard error (ms), from the rounds' median absolute deviation."""
        deltas = self.timings.deltas_ms
        mad = statistics.median(abs(d - self.median_ms) for d in deltas)
        return _MEDIAN_SE * _MAD_TO_STD * mad / math.sqrt(len(deltas))

    def modelled_ms(self, collectives: CollectiveModels) -> float:
        """What ``collectives`` price of the timed difference: three all-to-alls."""
        t = self.timings
        _, dim, bag = t.tables[0]
        peers = t.world_size - 1
        ids_mb = peers * t.batch_size * (bag * ID_BYTES + LENGTH_BYTES) / 1e6
        out_mb = peers * t.batch_size * dim * OUTPUT_BYTES / 1e6
        return sum(
            collectives.ms("all_to_all", t.world_size, mb) for mb in (ids_mb, out_mb, out_mb)
        )

    def unmodelled_ms(self, collectives: CollectiveModels) -> float:
        """:attr:`median_ms` less :meth:`modelled_ms`, at least 0."""
        return max(0.0, self.median_ms - self.modelled_ms(collectives))

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "timings": self.timings.to_dict(),
            "device": self.device,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardingPathModel:
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"sharding path model version {data.get('version')!r}, expected {FORMAT_VERSION}"
            )
        return cls(
            timings=PathTimings.from_dict(data["timings"]),
            device=str(data["device"]),
            source=str(data["source"]),
        )


@spent_on("sharding_path")
def measure_sharding_path_model(device: str = "cpu") -> ShardingPathModel:
    """Time the sharding path on the driven job group, else on 2 gloo CPU ranks."""
    group = active_group()
    if group is None and device != "cpu":
        raise ValueError(f"outside a job the sharding path is timed on CPU only, not {device!r}")
    timings = time_sharding_path()
    ranks = (
        f"{group.world} {group.backend} ranks of the job on {device_name(group.device.type)}"
        if group is not None
        else f"{timings.world_size} gloo ranks on {device_name(device)}"
    )
    source = f"{ranks}: DMP steps, every table data-parallel against one table-wise"
    return ShardingPathModel(timings, device if group is None else group.device.type, source)


def sharding_path_cache_file(device: str = "cpu") -> CacheFile:
    """This machine's cache file of the model."""
    return machine_cache_file("sharding_path", device, device, format=FORMAT_VERSION)


_LOADED: dict[str, ShardingPathModel] = loaded_memo()


def load_sharding_path_model(
    path: str | os.PathLike | None = None, device: str = "cpu"
) -> ShardingPathModel:
    """The model from ``path`` (default: :func:`sharding_path_cache_file`), timed if missing."""
    file = named_file(path) if path is not None else sharding_path_cache_file(device)
    return _load_cached(file, device)


def _load_cached(file: CacheFile, device: str) -> ShardingPathModel:
    return load_cached(
        file,
        "sharding path model file",
        ShardingPathModel.from_dict,
        lambda: measure_sharding_path_model(device),
        ShardingPathModel.to_dict,
        _LOADED,
    )


def group_sharding_path_file(group: JobGroup) -> CacheFile:
    """This machine's cache file of the model timed on the job ``group``."""
    topology = group_topology_key(group.backend, group.hosts)
    label = f"{group.backend}_{group.world}ranks"
    device = group.device.type
    return machine_cache_file(
        "sharding_path", device, label, format=FORMAT_VERSION, topology=topology
    )


def load_group_sharding_path(group: JobGroup) -> ShardingPathModel:
    """The model timed on the driven job ``group``, timed first if not cached."""
    return _load_cached(group_sharding_path_file(group), group.device.type)


def default_sharding_path_path(device: str = "cpu") -> Path:
    """Where :func:`sharding_path_cache_file` is."""
    return sharding_path_cache_file(device).path
