"""One sampled training step read off ``torch.profiler``: this rank's fused lookup, its
backward, each all-to-all and the data-parallel dense kernel (nested events count once)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MARK = "dreamshard::observed_step"  # a record_function at the start of a sampled step
# the first category that matches; "dp" first, as its backward's name holds SplitLookupFunction
_CATEGORIES = {
    "dp": ("dense_embedding_codegen_lookup", "SplitLookupFunction_Dense"),
    "fwd": ("split_embedding_codegen_lookup_", "split_embedding_codegen_forward"),
    "bwd": ("SplitLookupFunction", "split_embedding_backward_codegen"),
    "a2a": ("gloo:all_to_all", "nccl:all_to_all", "ncclDevKernel_AllToAll", "SendRecv"),
}


@dataclass
class StepProfile:
    """One sampled step on one rank.

    Args:
        step_ms: the step's wall time (from one ``observer.step()`` to the next).
        fwd_ms: fused embedding forward.
        bwd_ms: fused embedding backward (with the fused optimizer).
        a2a: every all-to-all as ``(wall-clock start s, ms)``.
        dp_ms: the data-parallel tables' dense kernel, forward and backward.
        peak_bytes: the step's transient memory peak (:func:`~.rank_memory.transient_peak`).
    """

    step_ms: float
    fwd_ms: float = 0.0
    bwd_ms: float = 0.0
    a2a: list[tuple[float, float]] = field(default_factory=list)
    dp_ms: float = 0.0
    peak_bytes: int = 0

    @property
    def a2a_ms(self) -> float:
        return sum(ms for _, ms in self.a2a)


def category(name: str) -> str | None:
    """The category of an event name (``None``: the rest of the step)."""
    for kind, keys in _CATEGORIES.items():
        if any(key in name for key in keys):
            return kind
    return None


def step_profile(events: Iterable[Any], step_ms: float, mark_wall_s: float) -> StepProfile:
    """The :class:`StepProfile` of a step's profiler ``events``; ``mark_wall_s``: the wall
    clock at the :data:`MARK` event's start."""
    events = list(events)
    marks = [e for e in events if e.name == MARK]
    origin_us = marks[0].time_range.start if marks else 0.0
    out = StepProfile(step_ms=step_ms)
    for e in events:
        kind = category(e.name)
        if kind is None or _inside_same(e, kind):
            continue
        ms = (e.time_range.end - e.time_range.start) / 1e3
        if kind == "a2a":
            out.a2a.append((mark_wall_s + (e.time_range.start - origin_us) / 1e6, ms))
        elif kind == "fwd":
            out.fwd_ms += ms
        elif kind == "bwd":
            out.bwd_ms += ms
        else:
            out.dp_ms += ms
    out.a2a.sort()
    return out


def _inside_same(event: Any, kind: str) -> bool:
    parent = getattr(event, "cpu_parent", None)
    while parent is not None:
        if category(parent.name) == kind:
            return True
        parent = getattr(parent, "cpu_parent", None)
    return False


def a2a_split(a2a: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """Per rank, ``(transfer_ms, wait_ms)`` of its all-to-alls (``a2a[r][k]``: rank ``r``'s
    ``k``-th as ``(start s, ms)``). A collective's own time runs from its last start to its
    first end; the rest of a rank's time is waiting for slower peers. Where the ranks'
    sequences differ, all of it counts as transfer."""
    if not a2a or len({len(s) for s in a2a}) != 1:
        return [(sum(ms for _, ms in s), 0.0) for s in a2a]
    transfer = 0.0
    for k in range(len(a2a[0])):
        last_start = max(s[k][0] for s in a2a)
        first_end = min(s[k][0] + s[k][1] / 1e3 for s in a2a)
        transfer += max(0.0, first_end - last_start) * 1e3
    return [(transfer, max(0.0, sum(ms for _, ms in s) - transfer)) for s in a2a]
