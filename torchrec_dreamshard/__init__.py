"""torchrec-dreamshard: a learned embedding-table sharding planner for TorchRec."""

from torchrec_dreamshard.tables import TableSpec
from torchrec_dreamshard.tasks import Task

__version__ = "0.1.0"
__all__ = ["TableSpec", "Task", "__version__"]
