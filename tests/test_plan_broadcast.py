"""What rank 0 sends under ``collective_plan`` when it fails to plan, and the error every
rank rebuilds from it: rank 0's class where it can be rebuilt, its message and traceback.

What crosses the ranks is pickled (``broadcast_object_list``); the tests pickle it here.
A 2-rank run is in ``tests/test_planner_distributed.py``."""

from __future__ import annotations

import pickle
import threading

import pytest
from torchrec.distributed.planner.types import PlannerError, PlannerErrorType

from torchrec_dreamshard.data.tasks import InsufficientMemoryError
from torchrec_dreamshard.planner.plans.plan_broadcast import PlanBroadcast, rebuild_error


class NotRebuiltError(Exception):
    """An error whose constructor takes more than a message."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message, code)


def placing_with_a_bug() -> None:
    raise ValueError("placement has 2 entries for 3 tables")


def failure_of(fn) -> PlanBroadcast:
    """What rank 0 sends when planning raised what ``fn`` raises."""
    try:
        fn()
    except Exception as exc:
        return PlanBroadcast.failure(exc, {"calibrated": False})
    raise AssertionError("fn raised nothing")


def received(sent: PlanBroadcast) -> PlanBroadcast:
    """``sent`` as another rank receives it."""
    return pickle.loads(pickle.dumps(sent))


def test_another_rank_raises_rank0s_class_with_its_message_and_traceback():
    sent = failure_of(placing_with_a_bug)
    got = received(sent)
    assert got.local_error is None and got.adaptation == {"calibrated": False}
    err = got.error()
    assert type(err) is ValueError and err.__cause__ is None
    text = str(err)
    assert text.startswith("rank 0 could not plan: ValueError: placement has 2 entries")
    assert "rank 0's traceback:\nTraceback (most recent call last):" in text
    assert "in placing_with_a_bug" in text and "test_plan_broadcast.py" in text


def test_rank0_raises_the_same_error_caused_by_its_own():
    sent = failure_of(placing_with_a_bug)
    err = sent.error()
    assert type(err) is ValueError and str(err) == str(received(sent).error())
    assert isinstance(err.__cause__, ValueError) and err.__suppress_context__
    assert str(err.__cause__) == "placement has 2 entries for 3 tables"


def test_a_planner_error_keeps_its_error_type():
    def fails():
        raise PlannerError("no room", PlannerErrorType.INSUFFICIENT_STORAGE)

    err = received(failure_of(fails)).error()
    assert type(err) is PlannerError
    assert err.error_type == PlannerErrorType.INSUFFICIENT_STORAGE
    text = str(err)
    assert text.startswith("rank 0 could not plan: torchrec.distributed.planner.types.PlannerError")
    assert "PlannerError: no room" in text and "in fails" in text


def test_a_package_error_is_rebuilt_where_its_module_is_loaded():
    def fails():
        raise InsufficientMemoryError("tables ['t0'] are bigger than every device")

    err = received(failure_of(fails)).error()
    assert type(err) is InsufficientMemoryError
    assert "torchrec_dreamshard.data.tasks.InsufficientMemoryError: tables" in str(err)


def test_an_error_that_cannot_be_rebuilt_is_a_runtime_error_naming_its_class():
    def fails():
        raise NotRebuiltError("half a plan", 7)

    err = received(failure_of(fails)).error()
    assert type(err) is RuntimeError
    assert f"{__name__}.NotRebuiltError: ('half a plan', 7)" in str(err)
    local = rebuild_error("a_module_nobody_imported", "Boom", "text")
    assert type(local) is RuntimeError and str(local) == "text"
    assert type(rebuild_error("builtins", "UnicodeDecodeError", "x")) is RuntimeError
    assert type(rebuild_error("builtins", "print", "x")) is RuntimeError  # not a class


def test_an_error_that_does_not_pickle_still_reaches_every_rank():
    class Holding(Exception):
        """Holds a lock: not picklable, and a local class: not rebuilt."""

        def __init__(self) -> None:
            super().__init__("holding a lock")
            self.lock = threading.Lock()

    def fails():
        raise Holding()

    sent = failure_of(fails)
    with pytest.raises((TypeError, AttributeError)):  # a local class, holding a lock
        pickle.dumps(sent.local_error)
    err = received(sent).error()
    assert type(err) is RuntimeError
    assert "Holding: holding a lock" in str(err) and "in fails" in str(err)
