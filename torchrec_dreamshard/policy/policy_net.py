"""The policy network, and the registry of policy networks a checkpoint may name
(:func:`register_policy`)."""

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
    """Class decorator: register a policy network class under ``name``: an ``nn.Module``
    with ``forward`` (``[..., in_dim + NUM_SCALARS]`` -> ``[...]``), ``in_dim``,
    ``CONFIG_LIMITS``, ``from_config(config, in_dim)`` and ``config()``.
    """

    def register(cls: _Net) -> _Net:
        if name in POLICY_NETWORKS:
            raise ValueError(f"policy network {name!r} is already registered")
        cls.architecture = name
        POLICY_NETWORKS[name] = cls
        return cls

    return register


def policy_class(config: Mapping[str, Any]) -> type[nn.Module]:
    """The policy network class ``config`` names (:data:`DEFAULT_POLICY` when it names none;
    a ``ValueError`` listing the known ones when it names another)."""
    name = config.get(POLICY_KEY, DEFAULT_POLICY)
    if not isinstance(name, str) or name not in POLICY_NETWORKS:
        raise ValueError(
            f"{POLICY_KEY} {name!r} is not a policy network of this package; known: "
            f"{sorted(POLICY_NETWORKS)}"
        )
    return POLICY_NETWORKS[name]


def build_networks(config: Mapping[str, Any]) -> tuple[CostNet, nn.Module]:
    """The cost and policy networks ``config`` describes, freshly initialised.

    Raises:
        ValueError: the config names no registered policy network.
        KeyError: an entry the networks are built from is missing.
    """
    policy = policy_class(config)
    cost_net = CostNet.from_config(config)
    return cost_net, policy.from_config(config, cost_net.enc_dim)


@register_policy(DEFAULT_POLICY)
class PolicyNet(nn.Module):
    """Per-device logits ``l_d = pi(u_d) - a (log s'_d - log s) - b (log t'_d - log s)``:
    ``s'_d`` and ``t'_d`` the predicted step and device cost were the table put on ``d``,
    ``s`` the current step, ``u_d = [log(1 + h'_d), scalars]``, ``pi`` an MLP, ``a, b > 0``.

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
        """Logits ``[...]`` from per-device inputs ``u`` ``[..., in_dim + NUM_SCALARS]``."""
        a, b = F.softplus(self.prior_raw)
        scal = u[..., self.in_dim :]
        return self.body(u).squeeze(-1) - a * scal[..., 0] - b * scal[..., 1]


class FrozenPolicy:
    """:meth:`PolicyNet.forward` with fixed weights, for roll-outs: the same logits, no gradient."""

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
        """The logits as float32 numpy, the prior terms from ``scalars``."""
        body = self._body(u).numpy()[..., 0]
        return body - self.a.numpy() * scalars[..., 0] - self.b.numpy() * scalars[..., 1]

    def _body(self, u: torch.Tensor) -> torch.Tensor:
        x = u
        for k, (weight, bias) in enumerate(self.layers):
            x = F.linear(torch.relu(x) if k else x, weight, bias)
        return x
