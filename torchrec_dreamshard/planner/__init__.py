"""DreamShard as a TorchRec planner: enumerator, proposer, partitioner (with the policy's
placement), perf model, stats and :class:`DreamShardPlanner`."""

from torchrec_dreamshard.planner.enumerators import CostNetShardEstimator, DreamShardEnumerator
from torchrec_dreamshard.planner.partitioners import DreamShardPartitioner
from torchrec_dreamshard.planner.perf_models import CostNetPerfModel
from torchrec_dreamshard.planner.placement import PolicyPlacer
from torchrec_dreamshard.planner.planners import DreamShardPlanner
from torchrec_dreamshard.planner.proposers import DreamShardProposer
from torchrec_dreamshard.planner.stats import CostNetStats
from torchrec_dreamshard.planner.types import DreamShardProposal, PlanPrediction

__all__ = [
    "CostNetPerfModel",
    "CostNetShardEstimator",
    "CostNetStats",
    "DreamShardEnumerator",
    "DreamShardPartitioner",
    "DreamShardPlanner",
    "DreamShardProposal",
    "DreamShardProposer",
    "PlanPrediction",
    "PolicyPlacer",
]
