"""Candidate sources from the planner side: plans the policy's safety net weighs but the
policy cannot make itself, because they come from TorchRec's planner (or, later, from a
user's proposer). See :class:`~torchrec_dreamshard.policy.protocol.CandidateSource`.

:func:`default_sources` are those every safe-mode plan weighs: hand them to an agent for
good (``load_checkpoint(path, sources=default_sources())``) or for one call
(``agent.place(task, sources=default_sources())``).
"""

from __future__ import annotations

from dataclasses import dataclass

from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.planner import baselines
from torchrec_dreamshard.policy import CandidateSource, is_large

TORCHREC_CANDIDATE = "torchrec_ours"  # the baselines' name of the same plan


@dataclass(frozen=True)
class TorchRecCandidate:
    """TorchRec's ``EmbeddingShardingPlanner`` (table-wise fused sharding) with our memory
    accounting, so that it finds a plan whenever whole tables fit: the baselines'
    ``torchrec_ours`` (:func:`torchrec_dreamshard.planner.baselines.torchrec_placement`).

    It declines tasks the safe mode plans in its bounded way
    (:func:`~torchrec_dreamshard.policy.is_large`): TorchRec's planner would take longer
    than the rest of the safety net there.

    It is a *baseline* (``baseline``): the plan the user had before swapping planners.
    Wherever plans are measured (:func:`~torchrec_dreamshard.calibration.verification.verify`)
    it is measured too, and no plan that measured slower than it is kept; where nothing is
    measured, the planner's stats give the kept plan's predicted margin over it.
    """

    name: str = TORCHREC_CANDIDATE
    baseline: bool = True

    def propose(self, task: Task) -> list[int] | None:
        """TorchRec's placement of ``task`` (``None`` on a large task).

        Raises:
            NoPlanError: TorchRec's planner found no plan (its message is kept).
        """
        if is_large(task):
            return None
        return baselines.torchrec_placement(task, ours=True)


def default_sources() -> tuple[CandidateSource, ...]:
    """The candidate sources of every safe-mode plan: TorchRec's planner."""
    return (TorchRecCandidate(),)
