"""The policy side of DreamShard: the agent, its networks, MDP, safety net, heuristics,
split search and checkpoints (no TorchRec planner imports)."""

from torchrec_dreamshard.policy.agent import (
    PLACEMENT_MODES,
    DreamShard,
    is_large,
)
from torchrec_dreamshard.policy.mdp import EstimatedMDP, PlacementError, Rollout
from torchrec_dreamshard.policy.policy_net import PolicyNet
from torchrec_dreamshard.policy.protocol import (
    CandidateSource,
    CostPrediction,
    FixedPlan,
    NoPlanError,
    PlacementAgent,
    PlaceSettings,
)
from torchrec_dreamshard.policy.safety_net import Candidate, SafetyReport, refine

__all__ = [
    "PLACEMENT_MODES",
    "Candidate",
    "CandidateSource",
    "CostPrediction",
    "DreamShard",
    "EstimatedMDP",
    "FixedPlan",
    "NoPlanError",
    "PlaceSettings",
    "PlacementAgent",
    "PlacementError",
    "PolicyNet",
    "Rollout",
    "SafetyReport",
    "is_large",
    "refine",
]
