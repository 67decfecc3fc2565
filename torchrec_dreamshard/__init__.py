"""torchrec-dreamshard: a learned embedding-table sharding planner for TorchRec."""

from typing import Any

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.version import __version__

__all__ = ["DreamShardPlanner", "TableSpec", "Task", "__version__", "observe"]


def __getattr__(name: str) -> Any:
    # DreamShardPlanner pulls in TorchRec's planner: import it only when asked for.
    if name == "DreamShardPlanner":
        from torchrec_dreamshard.planner.planners import DreamShardPlanner

        return DreamShardPlanner
    if name == "observe":  # the running job as the planner's measurement (feedback/)
        from torchrec_dreamshard.feedback.observer import observe

        return observe
    raise AttributeError(f"module 'torchrec_dreamshard' has no attribute {name!r}")
