"""The cost network's prediction of a plan per rank (:class:`PlanPrediction`), and the task it
rates."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.device_report import device_table


def prediction_task(specs: Sequence[TableSpec], num_devices: int, batch_size: int) -> Task:
    """A task for *rating* placements: memory is set so that any placement is valid."""
    return Task(
        tables=list(specs),
        num_devices=num_devices,
        memory_bytes=max(1, sum(t.size_bytes for t in specs)),
        batch_size=batch_size,
    )


@dataclass
class PlanPrediction:
    """The cost network's view of a plan, per rank.

    Args:
        fwd_ms, bwd_ms, comm_ms: predicted fused-kernel forward, backward and all-to-all
            ms of the DreamShard-placed tables on each rank.
        other_ms: TorchRec's perf estimate of the shards TorchRec placed, per rank.
        step_ms: the cost network's step cost plus the largest ``other_ms``.
        tables: number of tables on each rank.
        step_log_std: the ensemble members' spread of log step cost.
        penalty: how many of those spreads the planner's rating adds.
    """

    fwd_ms: list[float]
    bwd_ms: list[float]
    comm_ms: list[float]
    other_ms: list[float]
    step_ms: float
    tables: list[int] = field(default_factory=list)
    step_log_std: float = 0.0
    penalty: float = 0.0

    @property
    def score_ms(self) -> float:
        """The rating the planner minimises: step cost times ``exp(penalty * step_log_std)`` plus
        the largest ``other_ms``."""
        net = self.step_ms - max(self.other_ms, default=0.0)
        return net * math.exp(self.penalty * self.step_log_std) + max(self.other_ms, default=0.0)

    def total_ms(self, rank: int) -> float:
        return self.fwd_ms[rank] + self.bwd_ms[rank] + self.comm_ms[rank] + self.other_ms[rank]

    def to_dict(self) -> dict:
        return {
            "step_ms": self.step_ms,
            "step_log_std": self.step_log_std,
            "per_device": [
                {
                    "rank": r,
                    "tables": self.tables[r] if self.tables else None,
                    "fwd_ms": self.fwd_ms[r],
                    "bwd_ms": self.bwd_ms[r],
                    "comm_ms": self.comm_ms[r],
                    "other_ms": self.other_ms[r],
                }
                for r in range(len(self.fwd_ms))
            ],
        }

    def format(self) -> list[str]:
        """Rows of a per-rank table, as the planner logs it."""
        rows = device_table(
            [
                {
                    "tables": self.tables[r] if self.tables else 0,
                    "fwd_ms": self.fwd_ms[r],
                    "bwd_ms": self.bwd_ms[r],
                    "comm_ms": self.comm_ms[r],
                    "other_ms": self.other_ms[r],
                }
                for r in range(len(self.fwd_ms))
            ],
            figures=("fwd_ms", "bwd_ms", "comm_ms", "other_ms"),
            label="rank",
        )
        rows.append(f"Predicted step cost: {self.step_ms:.3f} ms")
        return rows
