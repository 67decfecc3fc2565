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

Networks from a config. :func:`build_networks` builds an agent's two networks from a config
(a checkpoint's metadata, or the sizes a new agent is given): the cost network
(:meth:`CostNet.from_config`) and the policy network its ``policy_architecture`` names in
:data:`POLICY_NETWORKS` (:data:`DEFAULT_POLICY` when it names none, as checkpoints written
before the key do). A new policy network is one class and one registration,
``@register_policy("name")``: an ``nn.Module`` whose ``forward`` maps the per-device inputs
``[..., in_dim + NUM_SCALARS]`` to logits ``[...]``, with an ``in_dim`` attribute (the cost
network's state width), ``CONFIG_LIMITS`` (its integer config entries and their largest
values, checked before anything is built), ``from_config(config, in_dim)`` and
``config()`` (the entries ``from_config`` reads; a checkpoint holds them and the name).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from torchrec_dreamshard.cost.cost_net import MAX_HIDDEN, CostNet, mlp

NUM_SCALARS = 12  # scalar inputs per device besides log(1 + h'_d)
POLICY_KEY = "policy_architecture"  # the config entry naming the policy network
DEFAULT_POLICY = "prior_mlp"  # the policy network of a config that names none
# every policy network a config may name, by name (register_policy adds one)
POLICY_NETWORKS: dict[str, type[nn.Module]] = {}
_Net = TypeVar("_Net", bound=type[nn.Module])


def register_policy(name: str) -> Callable[[_Net], _Net]:
    """A class decorator: the policy network class, under ``name`` in
    :data:`POLICY_NETWORKS` (see the module docstring for what the class provides).

    Raises:
        ValueError: ``name`` already names a policy network.
    """

    def register(cls: _Net) -> _Net:
        if name in POLICY_NETWORKS:
            raise ValueError(f"policy network {name!r} is already registered")
        cls.architecture = name
        POLICY_NETWORKS[name] = cls
        return cls

    return register


def policy_class(config: Mapping[str, Any]) -> type[nn.Module]:
    """The policy network class ``config`` names (:data:`DEFAULT_POLICY` when it names none).

    Raises:
        ValueError: it names no registered policy network (the known ones are listed).
    """
    name = config.get(POLICY_KEY, DEFAULT_POLICY)
    if not isinstance(name, str) or name not in POLICY_NETWORKS:
        raise ValueError(
            f"{POLICY_KEY} {name!r} is not a policy network of this package; known: "
            f"{sorted(POLICY_NETWORKS)}"
        )
    return POLICY_NETWORKS[name]


def build_networks(config: Mapping[str, Any]) -> tuple[CostNet, nn.Module]:
    """The cost network and the policy network ``config`` describes, freshly initialised on
    the default device (under ``torch.device("meta")`` they hold no memory: a checkpoint's
    shapes are checked so before its networks are built).

    Raises:
        ValueError: the config names no registered policy network.
        KeyError: an entry the networks are built from is missing.
    """
    policy = policy_class(config)
    cost_net = CostNet.from_config(config)
    return cost_net, policy.from_config(config, cost_net.enc_dim)


@register_policy(DEFAULT_POLICY)
class PolicyNet(nn.Module):
    """Per-device logit ``l_d`` (see the module docstring).

    Args:
        in_dim: width of the cost network's device states (its ``enc_dim``).
        hidden: width of the MLP.
    """

    architecture: ClassVar[str]  # its name in POLICY_NETWORKS (set by register_policy)
    CONFIG_LIMITS: ClassVar[dict[str, int]] = {"policy_hidden": MAX_HIDDEN}

    @classmethod
    def from_config(cls, config: Mapping[str, Any], in_dim: int) -> PolicyNet:
        """The network ``config`` describes (:meth:`config`), on states ``in_dim`` wide."""
        return cls(in_dim, config["policy_hidden"])

    def config(self) -> dict[str, Any]:
        """What :meth:`from_config` builds this network's shape from."""
        return {"policy_hidden": self.hidden}

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
