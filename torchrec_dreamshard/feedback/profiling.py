"""One training step of a DMP job, read off ``torch.profiler``: the time this rank spent
in FBGEMM's fused embedding kernels, forward and backward, and in each all-to-all.

A sampled step runs under the profiler (CPU activity; CUDA's too on a GPU rank). Its events
are sorted by name into categories; an event inside another of the same category (a
wrapper op around the kernel, say) is not counted twice:

* ``fwd``: FBGEMM's fused lookup (``split_embedding_codegen_lookup_*``, the op around the
  forward kernel, as calibration times the module's forward);
* ``bwd``: its backward, the fused optimizer's update included (the lookup's autograd
  node, ``SplitLookupFunction*``);
* ``a2a``: every all-to-all (``gloo:all_to_all``, ``nccl:all_to_all``, or on a GPU the
  NCCL kernel), each with its start on the wall clock, so that the report can tell a rank's
  wait for a slower peer from the collective itself (:func:`a2a_split`);
* ``dp``: the data-parallel tables' batched dense kernel, forward and backward
  (``dense_embedding_codegen_lookup_function`` and its autograd node
  ``SplitLookupFunction_Dense_Op``). It is matched first: its backward node's name also
  holds ``SplitLookupFunction``, and the fused kernel's figures (which a re-plan learns
  from) must not take it in.

Everything else of the step (the input pipeline, the dense part, DDP's all-reduce of the
data-parallel tables' and the dense part's gradients, the optimizer) is ``rest``. Names
are FBGEMM's and PyTorch's as of FBGEMM 1.8 and PyTorch 2.13; the CUDA names are written
to match and unmeasured here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MARK = "dreamshard::observed_step"  # a record_function at the start of a sampled step
_CATEGORIES = {  # the first category that matches; the outermost event of it counts
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
        a2a: every all-to-all as ``(start, ms)``: its start in seconds on this host's wall
            clock, and its duration.
        dp_ms: the data-parallel tables' dense kernel, forward and backward.
        peak_bytes: the step's transient memory peak beyond what the rank held at its
            start (:func:`~torchrec_dreamshard.feedback.rank_memory.transient_peak`).
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
    """The :class:`StepProfile` of a sampled step's profiler ``events`` (FunctionEvents),
    given the wall-clock time at the :data:`MARK` event's start."""
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
    """Per rank, ``(transfer_ms, wait_ms)`` of its all-to-alls: ``a2a[r][k]`` is rank
    ``r``'s ``k``-th all-to-all as ``(start s, ms)`` (every rank runs the same sequence).

    An all-to-all cannot finish before its last rank starts it, and a rank cannot finish
    before its peers have sent to it: the collective's own time is from its last start
    to its first end, the same on every rank, and what a rank spends outside that is
    waiting for slower peers. Where the ranks' sequences differ, each rank's whole time
    counts as transfer."""
    if not a2a or len({len(s) for s in a2a}) != 1:
        return [(sum(ms for _, ms in s), 0.0) for s in a2a]
    transfer = 0.0
    for k in range(len(a2a[0])):
        last_start = max(s[k][0] for s in a2a)
        first_end = min(s[k][0] + s[k][1] / 1e3 for s in a2a)
        transfer += max(0.0, first_end - last_start) * 1e3
    return [(transfer, max(0.0, sum(ms for _, ms in s) - transfer)) for s in a2a]
