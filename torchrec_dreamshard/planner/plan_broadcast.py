"""What rank 0 sends every rank from ``DreamShardPlanner.collective_plan``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchrec.distributed.planner.types import PlannerError, PlannerErrorType
from torchrec.distributed.types import ShardingPlan

from torchrec_dreamshard.planner.plan_prediction import PlanPrediction


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

    def error(self) -> Exception:
        """The error to raise on a rank that did not plan."""
        text = f"rank 0 could not plan: {self.error_class}: {self.message}"
        if self.planner_error_type is not None:
            return PlannerError(text, PlannerErrorType[self.planner_error_type])
        return (ValueError if self.error_class == "ValueError" else RuntimeError)(text)
