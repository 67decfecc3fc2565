"""The policy side of DreamShard, one concept per module:

* :mod:`~torchrec_dreamshard.policy.network`: the policy network ``PolicyNet``;
* :mod:`~torchrec_dreamshard.policy.mdp`: the estimated MDP and its roll-outs;
* :mod:`~torchrec_dreamshard.policy.search`: search mode's refinement by moves and swaps;
* :mod:`~torchrec_dreamshard.policy.agent`: the trained agent ``DreamShard``.
"""

from torchrec_dreamshard.policy.agent import CostPrediction, DreamShard
from torchrec_dreamshard.policy.mdp import EstimatedMDP, PlacementError, Rollout
from torchrec_dreamshard.policy.network import PolicyNet
from torchrec_dreamshard.policy.search import refine

__all__ = [
    "CostPrediction",
    "DreamShard",
    "EstimatedMDP",
    "PlacementError",
    "PolicyNet",
    "Rollout",
    "refine",
]
