"""torchrec-dreamshard: a learned embedding-table sharding planner for TorchRec."""

from typing import TYPE_CHECKING, Any

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.version import __version__

if TYPE_CHECKING:  # what a type checker sees; at run time __getattr__ imports them lazily
    from torchrec_dreamshard.feedback.observer import observe
    from torchrec_dreamshard.planner.planners import DreamShardPlanner

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
