"""How ``DreamShardPlanner.collective_plan`` plans once for every rank: every rank's
checkpoint checked, rank 0 plans while the others serve its measurements, and what rank 0
then sends every rank (:class:`PlanBroadcast`).

Where rank 0 fails to plan, every rank raises rank 0's error: of its class where this
process can rebuild it (a builtin exception, TorchRec's ``PlannerError`` with its
``error_type``, any exception class of a module this process has already imported whose
constructor takes one message; nothing is imported for it), else a ``RuntimeError`` naming
the class; its message holds rank 0's message and rank 0's traceback. Rank 0 raises the same
rebuilt error, its own exception as the cause, so that every rank takes the same branch of a
caller's ``except``."""

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
    """What rank 0 sends every rank from ``DreamShardPlanner.collective_plan``: the plan
    and its prediction, or the error (its class's module and qualified name, message,
    traceback text, ``PlannerErrorType`` name for a ``PlannerError``), and how planning
    adapted to the machine. Only text crosses the ranks: rank 0's exception itself stays
    on rank 0 (``local_error``, never pickled), where it is the raised error's cause."""

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
        """The error every rank raises (see the module docstring): rank 0's class where it
        can be rebuilt, else a ``RuntimeError``, naming the class, with rank 0's message
        and traceback; on rank 0, caused by its own exception."""
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
    """An exception of class ``module.qualname`` with message ``text``, where this process
    has that module imported and the class takes one message (a ``PlannerError`` subclass:
    the message and ``planner_error_type``); else a ``RuntimeError`` of ``text`` (which
    names the class). Nothing is imported."""
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

    First every rank shares ``load_error``, whether its checkpoint failed to load (one
    small ``all_gather_object``): if any did, every rank raises the same ``ValueError``
    naming the ranks and the reasons. While rank 0 plans, the other ranks serve its
    measurements (:mod:`torchrec_dreamshard.ranks.job_group`)."""
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
