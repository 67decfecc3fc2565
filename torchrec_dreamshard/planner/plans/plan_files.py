"""A sharding plan as a file TorchRec's ``PlanLoader`` loads (:func:`write_plan_file`,
:class:`FilePlanLoader`). A planner whose context hash equals the file's takes each
table's shards from it instead of planning; keys are recomputed from the fields on read.

The file (``"format": "torchrec_dreamshard.sharding_plan"``, version 1)::

    {"format": ..., "version": 1, "context_hash": "...", "torchrec_version": "1.8.0",
     "options": [{"module_path": "", "name": "t0", "sharding_type": "table_wise",
                  "compute_kernel": "fused", "partition_by": "device",
                  "cache_load_factor": null, "shape": [1000, 16],
                  "input_lengths": [2.0], "batch_size": 256,
                  "shards": [{"size": [1000, 16], "offset": [0, 0], "rank": 1,
                              "storage": {"hbm": 0, "ddr": 90000, "ssd": 0},
                              "perf": {"fwd_compute": 0.1, ...}}]}]}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torchrec
from torch import nn
from torchrec.distributed.planner.types import Perf, PlanLoader, Shard, ShardingOption, Storage
from torchrec.distributed.types import CacheParams

from torchrec_dreamshard.io import atomic_write, dumps_strict, read_json

FORMAT = "torchrec_dreamshard.sharding_plan"
VERSION = 1
PERF_FIELDS = tuple(f.name for f in dataclasses.fields(Perf))
STORAGE_FIELDS = tuple(f.name for f in dataclasses.fields(Storage))


def option_dict(option: ShardingOption) -> dict[str, Any]:
    """One chosen sharding option as plain data: its ``storage_hash`` fields, shape and shards."""
    return {
        "module_path": option.path,
        "name": option.name,
        "sharding_type": option.sharding_type,
        "compute_kernel": option.compute_kernel,
        "partition_by": option.partition_by,
        "cache_load_factor": option.cache_load_factor,
        "shape": [int(x) for x in option.tensor.shape],
        "input_lengths": [float(x) for x in option.input_lengths],
        "batch_size": int(option.batch_size),
        "shards": [
            {
                "size": [int(x) for x in s.size],
                "offset": [int(x) for x in s.offset],
                "rank": None if s.rank is None else int(s.rank),
                "storage": None if s.storage is None else dataclasses.asdict(s.storage),
                "perf": None if s.perf is None else dataclasses.asdict(s.perf),
            }
            for s in option.shards
        ],
    }


def plan_file_dict(options: Sequence[ShardingOption], context_hash: str) -> dict[str, Any]:
    """The plan file's contents for the chosen ``options`` planned under ``context_hash``."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "context_hash": context_hash,
        "torchrec_version": getattr(torchrec, "__version__", "unknown"),
        "options": [option_dict(o) for o in options],
    }


def write_plan_file(path: str | Path, options: Sequence[ShardingOption], context_hash: str) -> None:
    """Write the plan file of ``options`` and the planner's context hash to ``path``, atomically."""
    atomic_write(path, dumps_strict(plan_file_dict(options, context_hash)), "plan file")


class FilePlanLoader(PlanLoader):
    """TorchRec's ``PlanLoader`` over a plan file (:func:`write_plan_file`).

    Example::

        DreamShardPlanner(..., plan_loader=FilePlanLoader(path))

    Args:
        path: the plan file; read and checked here, before planning.

    Raises:
        ValueError: naming the file and the field, for every way the file can be wrong.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        data = read_json(path, "plan file")
        where = f"plan file {str(path)!r}"
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f'{where} is not a sharding plan ("format": {FORMAT!r})')
        if data.get("version") != VERSION:
            raise ValueError(f"{where}: version {data.get('version')!r}, this reads {VERSION}")
        if not isinstance(data.get("context_hash"), str):
            raise ValueError(f'{where}: "context_hash" must be a string')
        if not isinstance(data.get("options"), list) or not data["options"]:
            raise ValueError(f'{where}: "options" must be a list of sharding options')
        self._context = data["context_hash"]
        self._options = [_option(o, f"{where}, option {i}") for i, o in enumerate(data["options"])]

    def load(self) -> dict[int, ShardingOption]:
        """The file's options, keyed by ``ShardingOption.storage_hash()``."""
        return {o.storage_hash(): o for o in self._options}

    def plan_context_hash(self) -> str:
        """The context hash of the planner that wrote the plan."""
        return self._context

    def get_plan_id(self) -> str:
        """The plan's id in TorchRec's messages: the file's path."""
        return str(self.path)


def _option(data: Any, where: str) -> ShardingOption:
    """A sharding option of the file's ``data``, its module an empty ``nn.Module``."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be an object")
    text = {k: _typed(data, k, str, where) for k in ("name", "sharding_type", "compute_kernel")}
    shape = _ints(data.get("shape"), f"{where}: shape")
    load_factor = data.get("cache_load_factor")
    if load_factor is not None and not isinstance(load_factor, int | float):
        raise ValueError(f"{where}: cache_load_factor must be a number or null")
    shards = data.get("shards")
    if not isinstance(shards, list) or not shards:
        raise ValueError(f"{where}: shards must be a non-empty list")
    lengths = data.get("input_lengths")
    if not isinstance(lengths, list) or not all(isinstance(x, int | float) for x in lengths):
        raise ValueError(f"{where}: input_lengths must be a list of numbers")
    return ShardingOption(
        name=text["name"],
        tensor=torch.empty(shape, device="meta"),
        module=(_typed(data, "module_path", str, where), nn.Module()),
        input_lengths=[float(x) for x in lengths],
        batch_size=_typed(data, "batch_size", int, where),
        sharding_type=text["sharding_type"],
        partition_by=_typed(data, "partition_by", str, where),
        compute_kernel=text["compute_kernel"],
        shards=[_shard(s, f"{where}, shard {j}") for j, s in enumerate(shards)],
        cache_params=None if load_factor is None else CacheParams(load_factor=float(load_factor)),
    )


def _shard(data: Any, where: str) -> Shard:
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be an object")
    rank = data.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise ValueError(f"{where}: rank must be a rank (an integer >= 0), got {rank!r}")
    storage = _fields(data.get("storage"), Storage, STORAGE_FIELDS, f"{where}: storage")
    perf = _fields(data.get("perf"), Perf, PERF_FIELDS, f"{where}: perf")
    return Shard(
        size=_ints(data.get("size"), f"{where}: size"),
        offset=_ints(data.get("offset"), f"{where}: offset"),
        storage=storage,
        perf=perf,
        rank=rank,
    )


def _fields(data: Any, kind: type, names: tuple[str, ...], where: str) -> Any:
    """``kind(**data)`` where ``data`` holds numbers of ``kind``'s fields only."""
    if data is None:
        return None
    if not isinstance(data, Mapping) or not set(data) <= set(names):
        raise ValueError(f"{where} must be an object of {', '.join(names)}")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in data.values()):
        raise ValueError(f"{where} must hold numbers")
    return kind(**data)


def _ints(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value
    ):
        raise ValueError(f"{where} must be a list of whole numbers >= 0, got {value!r}")
    return list(value)


def _typed(data: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{where}: {key} must be a {kind.__name__}, got {value!r}")
    return value
