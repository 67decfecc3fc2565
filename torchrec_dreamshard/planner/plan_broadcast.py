"""How ``DreamShardPlanner.collective_plan`` plans once for every rank: every rank's
checkpoint checked, rank 0 plans while the others serve its measurements, and what rank 0
then sends every rank (:class:`PlanBroadcast`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torchrec.distributed.planner.types import PlannerError, PlannerErrorType
from torchrec.distributed.types import ShardingPlan

from torchrec_dreamshard.measure.distributed_job_group import JobGroup, broadcast, driving, serve
from torchrec_dreamshard.planner.plan_prediction import PlanPrediction

logger = logging.getLogger("torchrec_dreamshard.planner.planners")


@dataclass
class PlanBroadcast:
    """What rank 0 sends every rank from ``DreamShardPlanner.collective_plan``: the plan
    and its prediction, or the error (exception class name, message, ``PlannerErrorType``
    name for a ``PlannerError``), and how planning adapted to the machine."""

    plan: ShardingPlan | None
    prediction: PlanPrediction | None
    error_class: str = ""
    message: str = ""
    planner_error_type: str | None = None
    adaptation: dict[str, Any] | None = None

    @classmethod
    def failure(cls, exc: Exception, adaptation: dict[str, Any] | None) -> PlanBroadcast:
        """What rank 0 sends where planning raised ``exc`` (every rank raises it)."""
        kind = exc.error_type.name if isinstance(exc, PlannerError) else None
        return cls(None, None, type(exc).__name__, str(exc), kind, adaptation=adaptation)

    def error(self) -> Exception:
        """The error to raise on a rank that did not plan."""
        text = f"rank 0 could not plan: {self.error_class}: {self.message}"
        if self.planner_error_type is not None:
            return PlannerError(text, PlannerErrorType[self.planner_error_type])
        return (ValueError if self.error_class == "ValueError" else RuntimeError)(text)


def plan_on_rank0(
    load_error: str | None, plan: Callable[[], PlanBroadcast], pg: dist.ProcessGroup | None
) -> PlanBroadcast:
    """``plan()`` on rank 0 of ``pg`` (default: the world), sent to every rank.

    First every rank shares ``load_error``, whether its checkpoint failed to load (one
    small ``all_gather_object``): if any did, every rank raises the same ``ValueError``
    naming the ranks and the reasons. While rank 0 plans, the other ranks serve its
    measurements (:mod:`torchrec_dreamshard.measure.distributed_job_group`)."""
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
