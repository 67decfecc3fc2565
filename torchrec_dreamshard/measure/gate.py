"""Where measuring may happen: the gate every timing entry point of :mod:`measure` passes.

The planner measures in two steps only, the machine profile before TorchRec's loop and the
verification after it; everything in between (enumerator, proposers, partitioner,
performance model, stats) must time nothing. :func:`no_measuring` closes the gate for a
block of code: any timing entry point called inside it raises :class:`MeasuringForbidden`
naming what tried to measure, so a path that would measure in the wrong place fails loudly
instead of costing a user seconds in secret. The gate is a context variable: it is scoped
to the calling thread (and to the tasks of an ``asyncio`` loop), never process-wide.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_CLOSED: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "torchrec_dreamshard_measuring_closed", default=None
)


class MeasuringForbidden(RuntimeError):
    """A timing entry point was called where nothing may be measured."""


@contextlib.contextmanager
def no_measuring(why: str) -> Iterator[None]:
    """Inside this block every timing entry point raises :class:`MeasuringForbidden`;
    ``why`` says whose rule it is (it appears in the error)."""
    token = _CLOSED.set(why)
    try:
        yield
    finally:
        _CLOSED.reset(token)


@contextlib.contextmanager
def measuring_allowed() -> Iterator[None]:
    """Re-open the gate inside a closed block (the one step allowed to measure there)."""
    token = _CLOSED.set(None)
    try:
        yield
    finally:
        _CLOSED.reset(token)


def check_may_measure(what: str) -> None:
    """Raise :class:`MeasuringForbidden` when the gate is closed; ``what``: the entry
    point about to time something."""
    why = _CLOSED.get()
    if why is not None:
        raise MeasuringForbidden(f"{what} was called where nothing may be measured ({why})")


def measuring_closed() -> str | None:
    """Why the gate is closed here (``None``: open)."""
    return _CLOSED.get()
