"""Measuring that cannot fail the plan: :func:`guarded` runs one measurement and turns a
failure of the machine's measuring stack into a :class:`MeasureFailure` (which
measurement, the exception's type and message), so the caller goes on without it.

What counts as *measuring failed* (:func:`is_measuring_failure`), and so is caught:

* ``RuntimeError`` and its kinds: CUDA errors, ``torch.OutOfMemoryError`` (CUDA's
  out-of-memory), FBGEMM's "No such operator fbgemm::...", a collective's failure or
  timeout (``torch.distributed.DistError``, NCCL's and gloo's errors), a group task that
  failed on another rank;
* ``MemoryError`` (the host ran out of memory), ``TimeoutError`` and ``ConnectionError``
  (a collective's peer gone or late);
* an FBGEMM operator missing from the build: the ``AttributeError`` that ``torch.ops``
  raises for an operator it does not know (``'_OpNamespace' 'fbgemm' object has no
  attribute ...``), an ``ImportError`` of ``fbgemm_gpu``, an ``OSError`` loading its
  library;
* a spawned rank that raised or died (``torch.multiprocessing``'s
  ``ProcessRaisedException`` and ``ProcessExitedException``);
* CUDA asked of a CPU build of torch (its ``AssertionError``: "Torch not compiled with
  CUDA enabled"; a CUDA build without a GPU raises a ``RuntimeError``).

Everything else raises as before: the user's input errors (``ValueError`` and its kinds,
such as a store that cannot be opened or a placement that does not fit; ``TypeError``,
``KeyError``), any other ``AttributeError`` or ``AssertionError`` (a bug),
``KeyboardInterrupt`` and ``SystemExit``, and :class:`~.gate.MeasuringForbidden` (a
measurement where none may run is a bug of the caller's). Torch raises its device and
collective errors as ``RuntimeError``, so a ``RuntimeError`` from a bug on a measuring
path is recorded as a failed measurement too: it is named in the warning and the stats,
never silent.

After an out-of-memory on CUDA the caching allocator's free blocks are returned
(``torch.cuda.empty_cache()``), once the failed measurement's frames (its tensors) are
gone; nothing else of the process's memory is touched.
"""

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
    """Whether an error's text says a device ran out of memory (a measurement that kept
    the error as text, not the exception: ``measure_placement``'s ``ok=False``)."""
    low = text.lower()
    return "out of memory" in low or "outofmemoryerror" in low


def is_measuring_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says measuring failed on this machine (caught by :func:`guarded`),
    as opposed to the user's input error or a bug (raised): see the module docstring."""
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
    """Return the CUDA caching allocator's free blocks to the device (a no-op where CUDA
    was never initialised)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def guarded(
    what: str,
    measure: Callable[[], T],
    *,
    device: str = "cpu",
    warn: bool = True,
) -> T | MeasureFailure:
    """``measure()``, or the :class:`MeasureFailure` it raised where measuring failed
    (:func:`is_measuring_failure`; anything else is raised).

    Args:
        what: which measurement, for the record and the warning.
        measure: the measurement, called once with no arguments.
        device: ``"cuda"``: after an out-of-memory, empty the CUDA cache.
        warn: log one warning naming the cause (``False``: the caller gathers several
            failures and warns once, :func:`warn_failures`).

    Returns:
        What ``measure`` returned, or the failure.
    """
    try:
        return measure()
    except BaseException as exc:  # noqa: BLE001 - sorted by is_measuring_failure, else raised
        if not is_measuring_failure(exc):
            raise
        failure = MeasureFailure.of(what, exc)
    # out of the except block: the exception and its frames (the tensors of the failed
    # measurement) are released before the allocator is emptied
    if failure.out_of_memory and device == "cuda":
        empty_cuda_cache()
    if warn:
        warn_failures([failure])
    return failure


def warn_failures(failures: Sequence[MeasureFailure], going_on: str = "") -> None:
    """One warning for ``failures`` (none: nothing): the first's cause, how many there
    were, and ``going_on`` (what the planner does without them)."""
    if not failures:
        return
    first = failures[0]
    more = f" (and {len(failures) - 1} more measurements)" if len(failures) > 1 else ""
    tail = f"; {going_on}" if going_on else ""
    logging.getLogger(LOGGER).warning("measuring failed: %s%s%s", first.describe(), more, tail)


def failures_to_dicts(failures: Sequence[MeasureFailure]) -> list[dict[str, Any]]:
    """``failures`` as JSON-able dicts (the stats' ``measure_failures``)."""
    return [f.to_dict() for f in failures]
