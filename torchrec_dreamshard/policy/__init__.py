"""The policy side of DreamShard, one concept per module:

* :mod:`~torchrec_dreamshard.policy.policy_net`: the policy network ``PolicyNet``;
* :mod:`~torchrec_dreamshard.policy.mdp`: the estimated MDP and its roll-outs;
* :mod:`~torchrec_dreamshard.policy.safety_net`: candidate plans, refined, chosen by the
  uncertainty-penalised cost;
* :mod:`~torchrec_dreamshard.policy.protocol`: what users may touch on an agent
  (``PlacementAgent``) and how plans from outside the policy reach the safety net
  (``CandidateSource``);
* :mod:`~torchrec_dreamshard.policy.agent`: the trained agent ``DreamShard``;
* :mod:`~torchrec_dreamshard.policy.heuristics`: the classic placers, candidates of the
  safety net;
* :mod:`~torchrec_dreamshard.policy.split_search`: placing while cutting tables
  column-wise;
* :mod:`~torchrec_dreamshard.policy.checkpoint`: saving and loading an agent.

Nothing here imports TorchRec's planner: its plans are handed in as candidate sources from
the planner side (:mod:`torchrec_dreamshard.planner.stages.candidates`).
"""

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
