"""TorchRec's partitioning errors as a user reads them (:func:`readable_partition_error`):
the tables, their bytes and each device's free bytes instead of ``ShardingOption`` reprs."""

from __future__ import annotations

import re
from collections.abc import Sequence

from torchrec.distributed.planner.types import PlannerError, ShardingOption, Topology

from torchrec_dreamshard.planner.adapters.device_memory import (
    device_capacity,
    memory_tier,
    option_bytes,
)

# ShardingOptionGroup(sharding_options=[...], storage_sum=Storage(...), perf_sum=..., ...)
_GROUP = re.compile(
    r"ShardingOptionGroup\(sharding_options=\[.*?\], storage_sum=(Storage\([^)]*\))[^)]*\)"
)
_OBJECT = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")
MAX_LISTED = 12  # tables named in full; the rest are counted


def without_reprs(message: str) -> str:
    """``message`` with TorchRec's option reprs replaced by their storage or ``"a sharding
    option"``."""
    message = _GROUP.sub(lambda m: f"of {m.group(1)}", message)
    return _OBJECT.sub("a sharding option", message)


def tables_text(options: Sequence[ShardingOption], tier: str) -> str:
    """``".t0" (table_row_wise, 5253120 bytes), ...``: the options' tables, largest first."""
    sized = sorted(((option_bytes(o, tier), o) for o in options), key=lambda x: -x[0])
    shown = [f"{o.fqn!r} ({o.sharding_type}, {n} bytes)" for n, o in sized[:MAX_LISTED]]
    more = len(sized) - MAX_LISTED
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def free_text(free: Sequence[int], tier: str) -> str:
    """``"the 4 devices have 4250000 bytes of hbm free each"``, or each device's bytes."""
    if len(set(free)) == 1:
        return f"the {len(free)} devices have {free[0]} bytes of {tier} free each"
    shown = ", ".join(f"{d}: {b}" for d, b in enumerate(free[:MAX_LISTED]))
    more = f", ... ({len(free)} devices)" if len(free) > MAX_LISTED else ""
    return f"the devices have these bytes of {tier} free: {shown}{more}"


def readable_partition_error(
    exc: PlannerError, options: Sequence[ShardingOption], topology: Topology, what: str
) -> PlannerError:
    """``exc`` as a ``PlannerError`` of the same ``error_type`` naming the ``options``' tables
    and bytes and the free bytes of ``topology``'s devices (``what``: who failed)."""
    tier = memory_tier(topology)
    total = sum(option_bytes(o, tier) for o in options)
    message = (
        f"{what}: {tables_text(options, tier)}, {total} bytes in all (TorchRec's storage "
        f"estimate); {free_text(device_capacity(topology), tier)} after TorchRec's storage "
        f"reservation; TorchRec's partitioner said: {without_reprs(str(exc))}"
    )
    return PlannerError(message, exc.error_type)
