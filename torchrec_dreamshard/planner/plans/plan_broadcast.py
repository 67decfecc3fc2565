"""``DreamShardPlanner.collective_plan``'s broadcast: rank 0 plans while the others serve
its measurements, then sends every rank the plan or its error (:class:`PlanBroadcast`).
Every rank raises the same error, rebuilt where its class can be (:func:`rebuild_error`)."""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
from torchrec.distributed.planner.types import PlannerError, PlannerErrorType
from torchrec.distributed.types import ShardingPlan

from torchrec_dreamshard.planner.plans.plan_prediction import PlanPrediction
from torchrec_dreamshard.ranks.job_group import JobGroup, broadcast, driving, serve

logger = logging.getLogger("torchrec_dreamshard.planner.planners")


@dataclass
class PlanBroadcast:
    """What rank 0 sends every rank: the plan and its prediction, or the error as text, and
    the adaptation; rank 0's own exception (``local_error``) is never pickled."""

    plan: ShardingPlan | None
    prediction: PlanPrediction | None
    error_class: str = ""
    message: str = ""
    planner_error_type: str | None = None
    adaptation: dict[str, Any] | None = None
    error_module: str = ""
    traceback: str = ""
    local_error: BaseException | None = field(default=None, repr=False, compare=False)

    @classmethod
    def failure(cls, exc: Exception, adaptation: dict[str, Any] | None) -> PlanBroadcast:
        """What rank 0 sends where planning raised ``exc`` (every rank raises it)."""
        kind = exc.error_type.name if isinstance(exc, PlannerError) else None
        return cls(
            None,
            None,
            type(exc).__qualname__,
            str(exc),
            kind,
            adaptation=adaptation,
            error_module=type(exc).__module__,
            traceback="".join(traceback.format_exception(exc)),
            local_error=exc,
        )

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without ``local_error`` (rank 0's exception may not pickle)."""
        return {**self.__dict__, "local_error": None}

    def error(self) -> Exception:
        """The error every rank raises: rank 0's class where it can be rebuilt, else a
        ``RuntimeError``; on rank 0, caused by its own exception."""
        text = (
            f"rank 0 could not plan: {self.class_path}: {self.message}\n"
            f"rank 0's traceback:\n{self.traceback.rstrip()}"
        )
        err = rebuild_error(self.error_module, self.error_class, text, self.planner_error_type)
        if self.local_error is not None:
            err.__cause__ = self.local_error
            err.__suppress_context__ = True
        return err

    @property
    def class_path(self) -> str:
        """The error's class as ``module.QualName`` (just the name for a builtin)."""
        if self.error_module in ("", "builtins"):
            return self.error_class
        return f"{self.error_module}.{self.error_class}"


def rebuild_error(
    module: str, qualname: str, text: str, planner_error_type: str | None = None
) -> Exception:
    """An exception of class ``module.qualname`` with message ``text``, where that module is
    imported and the class takes one message; else a ``RuntimeError``. Nothing is imported."""
    cls: Any = sys.modules.get(module)
    for part in qualname.split(".") if cls is not None else ():
        cls = getattr(cls, part, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        return RuntimeError(text)
    args: tuple[Any, ...] = (text,)
    if issubclass(cls, PlannerError):
        kinds = PlannerErrorType.__members__
        args = (text, kinds.get(planner_error_type or "OTHER", PlannerErrorType.OTHER))
    try:
        return cls(*args)
    except TypeError:  # a constructor that takes more than a message (UnicodeDecodeError)
        return RuntimeError(text)


def plan_on_rank0(
    load_error: str | None, plan: Callable[[], PlanBroadcast], pg: dist.ProcessGroup | None
) -> PlanBroadcast:
    """``plan()`` on rank 0 of ``pg`` (default: the world), sent to every rank.

    Raises:
        ValueError: on every rank, where any rank's checkpoint failed to load (``load_error``).
    """
    if pg is None:
        if not dist.is_initialized():
            raise ValueError(
                "collective_plan needs an initialised process group; use plan() on one rank"
            )
        pg = dist.GroupMember.WORLD
    statuses: list[str | None] = [None] * dist.get_world_size(pg)
    dist.all_gather_object(statuses, load_error, group=pg)
    failures = [s for s in statuses if s]
    if failures:
        raise ValueError("; ".join(failures))
    group = JobGroup.of(pg)
    if group.rank == 0:
        with driving(group):
            sent = plan()
        broadcast(group, sent)
    else:
        logger.info("rank %d: measuring for rank 0 until it has planned", group.rank)
        sent = serve(group)
    assert isinstance(sent, PlanBroadcast)
    return sent
