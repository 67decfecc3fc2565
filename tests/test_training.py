"""The training loop's parts: REINFORCE on the estimated MDP, splits, metrics files."""

from __future__ import annotations

import csv

import pytest
import torch

from torchrec_dreamshard.cost.cost_net import context_values
from torchrec_dreamshard.cost.fitting import CostSample
from torchrec_dreamshard.data.sampler import TaskSampler
from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool
from torchrec_dreamshard.policy import DreamShard
from torchrec_dreamshard.training import (
    TrainConfig,
    split_holdout,
    train_policy,
    write_metrics,
)


def _greedy_cost(agent: DreamShard, task) -> float:
    return agent.predict(task, agent.place(task, "greedy")).step_ms


def test_reinforce_lowers_the_predicted_cost_of_the_greedy_plan():
    task = TaskSampler(synthetic_pool(60, scale=CPU_POOL_SCALE), seed=5).sample("train", 8, 3)
    agent = DreamShard.untrained(seed=0)
    with torch.no_grad():  # switch off the cost-greedy prior: start from a plain MLP policy
        agent.policy.prior_raw.fill_(-20.0)
        agent.policy.body[-1].weight.mul_(30.0)
    before = _greedy_cost(agent, task)
    cfg = TrainConfig(policy_rollouts=16, policy_lr=1e-2, entropy_coef=0.0, progress=False)
    for it in range(4):
        metrics = train_policy(agent, [task] * 15, cfg, it)
    after = _greedy_cost(agent, task)
    assert after < before
    assert set(metrics) >= {"losses/policy", "losses/entropy", "policy/pred_cost_ms"}


def test_holdout_keeps_task_groups_whole():
    def sample(group):
        return CostSample(group, None, [[0]], context_values(2, 8), None, 1.0)

    samples = [sample(f"it0-task{g}") for g in range(10) for _ in range(4)]
    samples += [sample("boot-single-1")]
    fit, held = split_holdout(samples, 0.3, seed=0)
    assert len(held) == 12 and len(fit) == 29
    assert not {s.group for s in fit} & {s.group for s in held}
    assert "boot-single-1" in {s.group for s in fit}


def test_metrics_csv_and_plot(tmp_path):
    write_metrics(tmp_path, {"iteration": 1, "losses/cost": 0.5})
    write_metrics(tmp_path, {"iteration": 2, "losses/cost": 0.3, "cost/mape": 12.0})
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [r["iteration"] for r in rows] == ["1", "2"]
    assert rows[1]["cost/mape"] == "12.0" and rows[0]["cost/mape"] == ""
    assert (tmp_path / "curves.png").stat().st_size > 1000


def test_config_errors():
    with pytest.raises(ValueError, match="backend"):
        TrainConfig(backend="tpu")
    with pytest.raises(ValueError, match="holdout"):
        TrainConfig(holdout_fraction=1.5)


def test_training_agents_weigh_the_planner_sides_candidates(tmp_path):
    """The safe-mode placements training measures weigh TorchRec's plan, as every
    safe-mode plan does (fresh and resumed agents alike)."""
    from torchrec_dreamshard.policy.checkpoint import save_checkpoint
    from torchrec_dreamshard.training.loop import CHECKPOINT_NAME, new_agent, resume_agent

    cfg = TrainConfig(out_dir=str(tmp_path), progress=False)
    fresh = new_agent(cfg)
    assert [s.name for s in fresh.sources] == ["torchrec_ours"]
    save_checkpoint(fresh, tmp_path / CHECKPOINT_NAME, extra={"iteration": 1})
    resumed, iteration, _ = resume_agent(cfg)
    assert iteration == 1 and [s.name for s in resumed.sources] == ["torchrec_ours"]
