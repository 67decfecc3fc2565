"""Comparing a plan with a recorded (golden) one, as any x86 CPU can reproduce it.

A plan recorded on one machine is not reproduced bit for bit on another: the cost network
runs in float32, and MKL and ATen pick other kernels (AVX-512, AVX2, another blocking)
on another CPU or under another ``ATEN_CPU_CAPABILITY`` / ``MKL_ENABLE_INSTRUCTIONS``, so
scores move in their last bits (a relative 1e-7 was seen on an AMD EPYC). Where two
choices score within those bits of each other, the other machine may take the other one.
Two such differences are not changes of the plan's quality:

- **a relabelling of identical devices**: the same tables (and shards) on each device,
  only with the devices numbered otherwise. :func:`canonical_partition` forgets the
  numbering: it keeps which items share a device, and which devices share a host, with
  every device's key (what makes devices differ: memory, say);
- **a tie**: another plan whose predicted cost, under the same cost model, is within
  :data:`TIE_RTOL` of the recorded plan's.

:func:`plan_differences` accepts both, and reports anything else: a plan whose predicted
cost moved beyond :data:`TIE_RTOL` (worse or better), whether or not its partition
changed.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence

TIE_RTOL = 1e-5
"""Relative tolerance of a predicted cost: what float32 arithmetic on another instruction
set (another order of reduction, fused multiply-adds) moves, with room to spare. A relative
1e-7 (one float32 ulp) was seen between CPUs; 1e-5 is about a hundred ulps, and stays
orders of magnitude below what a placement change costs (the smallest move of a table
changes a predicted step by 1e-3 or more)."""


def canonical_partition(
    contents: Mapping[int, Iterable[Hashable]],
    hosts: Sequence[Sequence[int]],
    device_key: Mapping[int, Hashable] | None = None,
) -> tuple:
    """What a plan places together, without the devices' numbers.

    Args:
        contents: the items (tables, shards: anything hashable and sortable) on each
            device, by device index; a device missing here holds nothing.
        hosts: the devices of each host, a partition of all devices. Devices are
            interchangeable within a host, and hosts with one another (one host holding
            every device: any two devices are).
        device_key: what tells devices apart beyond their host (memory, kind); devices of
            different keys are never interchanged. Default: all alike.

    Returns:
        A value equal for two plans iff one is the other with identical devices
        renumbered: per host the sorted ``(key, sorted items)`` of its devices, the hosts
        sorted.

    Raises:
        ValueError: ``contents`` names a device in no host, or a device is in two hosts.
    """
    seen = [d for host in hosts for d in host]
    if len(seen) != len(set(seen)):
        raise ValueError(f"hosts must partition the devices, got {hosts!r}")
    stray = sorted(set(contents) - set(seen))
    if stray:
        raise ValueError(f"devices {stray} hold items but are in no host of {hosts!r}")
    keys = device_key or {}

    def device(d: int) -> tuple:
        return (repr(keys.get(d)), tuple(sorted(contents.get(d, ()), key=repr)))

    return tuple(sorted((tuple(sorted(device(d) for d in host)) for host in hosts), key=repr))


def placement_partition(placement: Sequence[int], memory: Sequence[int] | None = None) -> tuple:
    """:func:`canonical_partition` of a task's ``placement`` (a device per table, or per
    shard): which tables share a device, devices of equal ``memory`` interchangeable
    (default: all devices alike)."""
    contents: dict[int, list[int]] = {}
    for item, device in enumerate(placement):
        contents.setdefault(int(device), []).append(item)
    devices = range(len(memory) if memory else max(contents, default=-1) + 1)
    keys = dict(enumerate(memory)) if memory else None
    return canonical_partition(contents, [list(devices)], keys)


def plan_differences(
    want: tuple[tuple, float | None],
    got: tuple[tuple, float | None],
    rtol: float = TIE_RTOL,
) -> list[str]:
    """How a plan differs from the recorded one, beyond a relabelling or a tie.

    Args:
        want: the recorded plan's canonical partition (:func:`canonical_partition`) and
            its predicted cost (``None``: the planner predicted none).
        got: the same of the plan made now.
        rtol: relative tolerance of the predicted costs (a tie).

    Returns:
        One line per difference; empty when the plans are the same up to a relabelling of
        identical devices with costs within ``rtol``, or different plans whose costs are
        within ``rtol`` (a tie, which another CPU may break the other way).
    """
    (want_part, want_cost), (got_part, got_cost) = want, got
    same = want_part == got_part
    if want_cost is None or got_cost is None:
        if want_cost is not got_cost:
            return [f"predicted cost {want_cost} -> {got_cost}"]
        return [] if same else ["the plan changed (no predicted cost to call it a tie)"]
    if math.isclose(want_cost, got_cost, rel_tol=rtol):
        return []
    rel = (got_cost - want_cost) / abs(want_cost) if want_cost else math.inf
    what = "the same plan" if same else "another plan, not a tie"
    return [f"{what}: predicted cost {want_cost:.6f} -> {got_cost:.6f} ({rel:+.2e} relative)"]
