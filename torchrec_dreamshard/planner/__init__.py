"""DreamShard as a TorchRec planner: enumerator, proposer, partitioner (with the policy's
placement), perf model, stats and :class:`DreamShardPlanner`, and the value it hands the
job it planned (:class:`PlanRecord`)."""

from torchrec_dreamshard.planner.planners import DreamShardPlanner
from torchrec_dreamshard.planner.plans.plan_prediction import PlanPrediction
from torchrec_dreamshard.planner.plans.plan_record import PlannerFactory, PlanRecord
from torchrec_dreamshard.planner.stages.enumerators import DreamShardEnumerator
from torchrec_dreamshard.planner.stages.partitioners import DreamShardPartitioner
from torchrec_dreamshard.planner.stages.perf_models import CostNetPerfModel
from torchrec_dreamshard.planner.stages.placement import PolicyPlacer
from torchrec_dreamshard.planner.stages.proposal import DreamShardProposal
from torchrec_dreamshard.planner.stages.proposers import DreamShardProposer
from torchrec_dreamshard.planner.stages.shard_estimators import CostNetShardEstimator
from torchrec_dreamshard.planner.stages.stats import CostNetStats

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
