"""The policy network.

Policy. Unlike the original DreamShard, the policy sees the table it is placing: for each
device ``d`` it gets the state *as if table i were added there*,
``h'_d = h_d + e_i``, the cost network's device costs ``t'_d`` and overall step
``s'_d`` for that state, and the current ones, all as log-ratios to the current step
(so they do not depend on the task's scale) plus the memory used. The logit is

    l_d = pi(u_d) - a * (log s'_d - log s) - b * (log t'_d - log s),

with ``u_d = [log(1 + h'_d), scalars]``, ``pi`` an MLP, ``a, b > 0`` learned scalars
(softplus). The two prior terms make the untrained policy a cost-greedy placer (the device
whose addition raises the predicted step least, then the least loaded one), and REINFORCE
learns the correction ``pi``. ``pi(u)`` is computed for all devices at once, so one step
costs a few small matrix products whatever the number of devices.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from torchrec_dreamshard.cost.cost_net import mlp

NUM_SCALARS = 12  # scalar inputs per device besides log(1 + h'_d)


class PolicyNet(nn.Module):
    """Per-device logit ``l_d`` (see the module docstring).

    Args:
        in_dim: width of the cost network's device states (its ``enc_dim``).
        hidden: width of the MLP.
    """

    def __init__(self, in_dim: int, hidden: int = 64):
        super().__init__()
        self.in_dim, self.hidden = in_dim, hidden
        self.body = mlp([in_dim + NUM_SCALARS, hidden, hidden, 1])
        with torch.no_grad():
            self.body[-1].weight.mul_(0.1)
            self.body[-1].bias.zero_()
        # softplus^-1 of the prior weights a = 20, b = 2
        self.prior_raw = nn.Parameter(torch.tensor([20.0, 2.0 + math.log(-math.expm1(-2.0))]))

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """Logits ``[...]`` from per-device inputs ``u`` ``[..., in_dim + NUM_SCALARS]``;
        the scalars' first two entries are the step and device-total log-ratios."""
        a, b = F.softplus(self.prior_raw)
        scal = u[..., self.in_dim :]
        return self.body(u).squeeze(-1) - a * scal[..., 0] - b * scal[..., 1]


class FrozenPolicy:
    """:meth:`PolicyNet.forward` as a roll-out calls it, once per table with weights that do
    not change: the prior weights' softplus taken once and the layers applied directly.
    The same operations on the same tensors, so the same logits; no gradient flows
    through them. :meth:`of` gives a policy with its own ``forward`` as it is."""

    @staticmethod
    def of(policy: PolicyNet) -> Callable[[torch.Tensor], torch.Tensor]:
        """``policy``'s logits: frozen where ``forward`` is :class:`PolicyNet`'s."""
        return FrozenPolicy(policy) if type(policy).forward is PolicyNet.forward else policy

    def __init__(self, policy: PolicyNet):
        with torch.no_grad():
            self.a, self.b = F.softplus(policy.prior_raw)
        self.layers = [(m.weight, m.bias) for m in policy.body if isinstance(m, nn.Linear)]
        self.in_dim = policy.in_dim

    def __call__(self, u: torch.Tensor) -> torch.Tensor:
        scal = u[..., self.in_dim :]
        return self._body(u).squeeze(-1) - self.a * scal[..., 0] - self.b * scal[..., 1]

    def numpy_logits(self, u: torch.Tensor, scalars: np.ndarray) -> np.ndarray:
        """The logits as a float32 array, the prior terms taken from ``scalars`` (the
        float32 array ``u[..., in_dim:]`` was made of) in numpy: the same arithmetic."""
        body = self._body(u).numpy()[..., 0]
        return body - self.a.numpy() * scalars[..., 0] - self.b.numpy() * scalars[..., 1]

    def _body(self, u: torch.Tensor) -> torch.Tensor:
        x = u
        for k, (weight, bias) in enumerate(self.layers):
            x = F.linear(torch.relu(x) if k else x, weight, bias)
        return x
