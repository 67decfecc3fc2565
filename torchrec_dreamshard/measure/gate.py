"""The gate every timing entry point passes: inside :func:`no_measuring` any timing raises
:class:`MeasuringForbidden` (a context variable, scoped to the calling thread or task)."""

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
    """Close the gate for the block; ``why`` appears in the error."""
    token = _CLOSED.set(why)
    try:
        yield
    finally:
        _CLOSED.reset(token)


def check_may_measure(what: str) -> None:
    """Raise :class:`MeasuringForbidden` naming ``what`` when the gate is closed."""
    why = _CLOSED.get()
    if why is not None:
        raise MeasuringForbidden(f"{what} was called where nothing may be measured ({why})")
