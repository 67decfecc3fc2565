"""DreamShard as a TorchRec planner: enumerator, proposer, partitioner (with the policy's
placement), perf model, stats and :class:`DreamShardPlanner`, and the value it hands the
job it planned (:class:`PlanRecord`)."""

from torchrec_dreamshard.planner.enumerators import DreamShardEnumerator
from torchrec_dreamshard.planner.partitioners import DreamShardPartitioner
from torchrec_dreamshard.planner.perf_models import CostNetPerfModel
from torchrec_dreamshard.planner.placement import PolicyPlacer
from torchrec_dreamshard.planner.plan_prediction import PlanPrediction
from torchrec_dreamshard.planner.plan_record import PlannerFactory, PlanRecord
from torchrec_dreamshard.planner.planners import DreamShardPlanner
from torchrec_dreamshard.planner.proposal import DreamShardProposal
from torchrec_dreamshard.planner.proposers import DreamShardProposer
from torchrec_dreamshard.planner.shard_estimators import CostNetShardEstimator
from torchrec_dreamshard.planner.stats import CostNetStats

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
    "PlanRecord",
    "PlannerFactory",
    "PolicyPlacer",
]
