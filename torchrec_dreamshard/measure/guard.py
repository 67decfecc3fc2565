"""Measuring that cannot fail the plan: :func:`guarded` turns a failure of the measuring
stack (device, collective, FBGEMM, spawned ranks, out of memory; any ``RuntimeError``) into
a :class:`MeasureFailure`; ``ValueError``, other bugs and ``MeasuringForbidden`` are raised."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import torch

from torchrec_dreamshard.measure.gate import MeasuringForbidden

T = TypeVar("T")
LOGGER = "torchrec_dreamshard.measure"
_MESSAGE_CHARS = 500  # of an exception's message kept in the record


@dataclass(frozen=True)
class MeasureFailure:
    """A measurement that failed, as :func:`guarded` recorded it.

    Attributes:
        what: which measurement (``"calibration: reference kernel"``).
        error: the exception's type name (``"OutOfMemoryError"``).
        message: its message (first line, at most 500 characters).
        out_of_memory: an out-of-memory (the CUDA cache was emptied where on CUDA).
    """

    what: str
    error: str
    message: str
    out_of_memory: bool = False

    def describe(self) -> str:
        """``"<what> failed: <error>: <message>"``, for people."""
        return f"{self.what} failed: {self.error}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, what: str, exc: BaseException) -> MeasureFailure:
        """The record of ``exc`` raised by the measurement ``what``."""
        text = str(exc).strip()
        first = text.splitlines()[0] if text else ""
        oom = isinstance(exc, torch.OutOfMemoryError | MemoryError) or is_oom_text(text)
        return cls(what, type(exc).__name__, first[:_MESSAGE_CHARS], oom)


def is_oom_text(text: str) -> bool:
    """Whether an error's text (``measure_placement``'s ``ok=False``) says out of memory."""
    low = text.lower()
    return "out of memory" in low or "outofmemoryerror" in low


def is_measuring_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of the measuring stack (caught by :func:`guarded`)."""
    import torch.multiprocessing as mp

    if isinstance(exc, ValueError | KeyboardInterrupt | SystemExit | MeasuringForbidden):
        return False
    if isinstance(exc, RuntimeError | MemoryError | TimeoutError | ConnectionError):
        return True
    if isinstance(exc, mp.ProcessRaisedException | mp.ProcessExitedException):
        return True
    if isinstance(exc, AttributeError):
        return "_OpNamespace" in str(exc)  # torch.ops.<namespace>.<missing operator>
    if isinstance(exc, AssertionError):
        return "not compiled with CUDA" in str(exc)  # a CPU build of torch asked for CUDA
    if isinstance(exc, ImportError):
        return (exc.name or "").startswith("fbgemm_gpu") or "fbgemm" in str(exc)
    if isinstance(exc, OSError):
        return "fbgemm" in str(exc)
    return False


def empty_cuda_cache() -> None:
    """``torch.cuda.empty_cache()`` where CUDA was initialised."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def guarded(
    what: str,
    measure: Callable[[], T],
    *,
    device: str = "cpu",
    warn: bool = True,
) -> T | MeasureFailure:
    """``measure()``, or the :class:`MeasureFailure` where measuring failed (else raised).

    Args:
        what: which measurement, for the record and the warning.
        device: ``"cuda"``: after an out-of-memory, empty the CUDA cache.
        warn: log one warning (``False``: the caller warns once, :func:`warn_failures`).
    """
    try:
        return measure()
    except BaseException as exc:  # noqa: BLE001 - sorted by is_measuring_failure, else raised
        if not is_measuring_failure(exc):
            raise
        failure = MeasureFailure.of(what, exc)
    # out of the except block, so the failed measurement's frames are freed before emptying
    if failure.out_of_memory and device == "cuda":
        empty_cuda_cache()
    if warn:
        warn_failures([failure])
    return failure


def warn_failures(failures: Sequence[MeasureFailure], going_on: str = "") -> None:
    """One warning: the first failure, how many more, and ``going_on`` (what happens next)."""
    if not failures:
        return
    first = failures[0]
    more = f" (and {len(failures) - 1} more measurements)" if len(failures) > 1 else ""
    tail = f"; {going_on}" if going_on else ""
    logging.getLogger(LOGGER).warning("measuring failed: %s%s%s", first.describe(), more, tail)


def failures_to_dicts(failures: Sequence[MeasureFailure]) -> list[dict[str, Any]]:
    """``failures`` as JSON-able dicts (the stats' ``measure_failures``)."""
    return [f.to_dict() for f in failures]
