"""The policy side of DreamShard, one concept per module:

* :mod:`~torchrec_dreamshard.policy.network`: the policy network ``PolicyNet``;
* :mod:`~torchrec_dreamshard.policy.mdp`: the estimated MDP and its roll-outs;
* :mod:`~torchrec_dreamshard.policy.safety_net`: candidate plans, refined, chosen by the
  uncertainty-penalised cost;
* :mod:`~torchrec_dreamshard.policy.agent`: the trained agent ``DreamShard``.
"""

from torchrec_dreamshard.policy.agent import PLACEMENT_MODES, CostPrediction, DreamShard
from torchrec_dreamshard.policy.mdp import EstimatedMDP, PlacementError, Rollout
from torchrec_dreamshard.policy.network import PolicyNet
from torchrec_dreamshard.policy.safety_net import SafetyReport, refine

__all__ = [
    "PLACEMENT_MODES",
    "CostPrediction",
    "DreamShard",
    "EstimatedMDP",
    "PlacementError",
    "PolicyNet",
    "Rollout",
    "SafetyReport",
    "refine",
]
