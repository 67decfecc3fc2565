"""REINFORCE on the estimated MDP: the policy's training, no hardware touched."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.nn import functional as F

from torchrec_dreamshard.cost.cost_net import single_thread
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.policy import DreamShard
from torchrec_dreamshard.training.collection_jobs import progress_bar
from torchrec_dreamshard.training.train_config import TrainConfig


def reinforce_update(
    agent: DreamShard,
    task: Task,
    opt: torch.optim.Optimizer,
    rollouts: int,
    entropy_coef: float,
    generator: torch.Generator,
) -> dict[str, float]:
    """One REINFORCE step on ``task``'s estimated MDP.

    ``R_k = -log step_hat_k`` of ``K`` sampled roll-outs, normalised across them,
    ``A_k = (R_k - mean R) / (std R + 1e-6)``; the loss is
    ``-mean_k A_k sum_t log pi(a_tk | s_tk) - c * mean_t,k H(pi(. | s_tk))``.
    """
    mdp = agent.mdp(task)
    roll = mdp.rollout(agent.policy, rollouts, greedy=False, generator=generator, record=True)
    ret = -roll.log_step
    adv = (ret - ret.mean()) / (ret.std() + 1e-6)
    logits = agent.policy(roll.inputs).masked_fill(~roll.legal, float("-inf"))
    logp = F.log_softmax(logits, dim=-1)
    chosen = logp.gather(-1, roll.actions.unsqueeze(-1)).squeeze(-1).sum(0)
    safe = logp.masked_fill(~roll.legal, 0.0)
    entropy = -(safe.exp() * safe).sum(-1).mean()
    loss = -(adv * chosen).mean() - entropy_coef * entropy
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(agent.policy.parameters(), 1.0)
    opt.step()
    return {
        "losses/policy": loss.item(),
        "losses/entropy": entropy.item(),
        "policy/pred_cost_ms": float(torch.exp(roll.log_step).mean()),
    }


def train_policy(
    agent: DreamShard, tasks: list[Task], cfg: TrainConfig, it: int
) -> dict[str, float]:
    """REINFORCE over ``tasks`` (one update each); returns mean metrics."""
    opt = torch.optim.Adam(agent.policy.parameters(), lr=cfg.policy_lr)
    gen = torch.Generator().manual_seed(cfg.seed * 7919 + it)
    agent.policy.train()
    rows = []
    with single_thread():
        for task in progress_bar(tasks, cfg.progress, "policy"):
            rows.append(
                reinforce_update(agent, task, opt, cfg.policy_rollouts, cfg.entropy_coef, gen)
            )
    agent.policy.eval()
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]} if rows else {}


@torch.no_grad()
def greedy_predicted_ms(agent: DreamShard, tasks: list[Task]) -> float:
    """Geometric mean of the cost network's step cost for the policy's greedy placements."""
    logs = [math.log(agent.predict(t, agent.place(t, mode="greedy")).step_ms) for t in tasks]
    return float(math.exp(np.mean(logs)))
