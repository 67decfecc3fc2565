"""Proposers side by side: :class:`TrackedProposer` records each proposer's best rating
in a :class:`ProposalLog`, so the stats can say which proposal won.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torchrec.distributed.planner.types import Enumerator, Proposer, ShardingOption, Topology


@dataclass
class ProposalLog:
    """Every proposer's best rating in the last plan, by proposer label.

    Attributes:
        best: each proposer's lowest rating.
        proposals: how many proposals each proposer made.
        winner: the proposer whose proposal the planner kept (``None``: none partitioned).
    """

    best: dict[str, float] = field(default_factory=dict)
    proposals: dict[str, int] = field(default_factory=dict)
    winner: str | None = None
    _winning: float = math.inf

    def reset(self) -> None:
        self.best, self.proposals, self.winner, self._winning = {}, {}, None, math.inf

    def record(self, label: str, rating: float | None) -> None:
        if rating is None:
            return
        self.best[label] = min(self.best.get(label, math.inf), rating)
        if rating < self._winning:
            self._winning, self.winner = rating, label

    def lines(self) -> list[str]:
        """One row per proposer: proposals made, best rating, and which won."""
        rows = []
        for label, n in self.proposals.items():
            best = self.best.get(label, math.inf)
            rated = f"best rating {best:.3f}" if math.isfinite(best) else "no plan"
            mark = "  <- chosen" if label == self.winner else ""
            rows.append(f"{label}: {n} proposal(s), {rated}{mark}")
        return rows


class TrackedProposer(Proposer):
    """A proposer whose proposals and ratings are recorded in ``log`` under ``label``."""

    def __init__(self, proposer: Proposer, label: str, log: ProposalLog) -> None:
        self.proposer = proposer
        self.label = label
        self._log = log

    def load(self, search_space: list[ShardingOption], enumerator: Enumerator | None = None):
        self._log.proposals.setdefault(self.label, 0)
        self.proposer.load(search_space=search_space, enumerator=enumerator)

    def propose(self) -> list[ShardingOption] | None:
        proposal = self.proposer.propose()
        if proposal is not None:
            self._log.proposals[self.label] = self._log.proposals.get(self.label, 0) + 1
        return proposal

    def feedback(
        self,
        partitionable: bool,
        plan: list[ShardingOption] | None = None,
        perf_rating: float | None = None,
        storage_constraint: Topology | None = None,
    ) -> None:
        if partitionable:
            self._log.record(self.label, perf_rating)
        self.proposer.feedback(
            partitionable=partitionable,
            plan=plan,
            perf_rating=perf_rating,
            storage_constraint=storage_constraint,
        )


def tracked(proposers: list[Proposer]) -> tuple[list[TrackedProposer], ProposalLog]:
    """Every proposer wrapped into one new log, as ``DreamShardProposer`` (the first) and
    ``<class name>#<i>`` (the user's i-th)."""
    log = ProposalLog()
    users = [f"{type(p).__name__}#{i}" for i, p in enumerate(proposers[1:])]
    labels = ["DreamShardProposer", *users]
    return [TrackedProposer(p, label, log) for p, label in zip(proposers, labels, strict=True)], log
