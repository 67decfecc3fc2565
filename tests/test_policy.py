"""The estimated MDP and the agent's placements: memory, errors, any T and D."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchrec_dreamshard.policy import DreamShard, PlacementError
from torchrec_dreamshard.pool import CPU_POOL_SCALE, synthetic_pool
from torchrec_dreamshard.sampler import TaskSampler, make_task
from torchrec_dreamshard.tables import TableSpec
from torchrec_dreamshard.tasks import Task, check_placement, device_bytes


@pytest.fixture(scope="module")
def sampler():
    return TaskSampler(synthetic_pool(300, scale=CPU_POOL_SCALE), seed=2)


@pytest.fixture(scope="module")
def agent():
    return DreamShard.untrained(seed=5)


@pytest.mark.parametrize("factor", [1.02, 1.1, 1.5])
@pytest.mark.parametrize("devices", [2, 4, 8])
def test_never_picks_a_device_without_room(sampler, agent, factor, devices):
    task = sampler.sample("test", 30, devices, memory_factor=factor)
    for mode in ("greedy", "search"):
        placement = agent.place(task, mode=mode, num_samples=8)
        check_placement(task, placement)  # raises if a device is over its memory
    mdp = agent.mdp(task)
    roll = mdp.rollout(agent.policy, 16, greedy=False, generator=torch.Generator().manual_seed(0))
    for row in roll.placements:
        used = device_bytes(task, row.tolist())
        assert all(u <= m for u, m in zip(used, task.memory, strict=True))


def test_recorded_actions_are_legal(sampler, agent):
    task = sampler.sample("train", 20, 4, memory_factor=1.05)
    roll = agent.mdp(task).rollout(agent.policy, 8, greedy=False, record=True)
    chosen = roll.legal.gather(-1, roll.actions.unsqueeze(-1))
    assert bool(chosen.all())


def test_placement_error_names_the_table():
    tables = [TableSpec(name=f"big{i}", rows=15, dim=1, pooling_factor=1.0) for i in range(3)]
    task = Task(tables=tables, num_devices=2, memory_bytes=100, batch_size=64)  # 60 B each
    with pytest.raises(PlacementError, match="big"):
        DreamShard.untrained().place(task)


@pytest.mark.parametrize(("num_tables", "devices"), [(1, 1), (1, 8), (5, 1), (120, 16)])
def test_any_number_of_tables_and_devices(sampler, agent, num_tables, devices):
    tables = sampler.splits["test"][:num_tables]
    task = make_task(tables, devices, 2048, memory_factor=2.0)
    placement = agent.place(task)
    assert len(placement) == num_tables
    assert set(placement) <= set(range(devices))
    pred = agent.predict(task, placement)
    assert len(pred.fwd_ms) == devices and pred.step_ms > 0
    assert agent.table_costs(task).shape == (num_tables,)


def test_search_is_no_worse_than_greedy_by_the_cost_net(sampler, agent):
    task = sampler.sample("test", 40, 4)
    greedy = agent.predict(task, agent.place(task)).step_ms
    search = agent.predict(task, agent.place(task, "search", num_samples=16, seed=1)).step_ms
    assert search <= greedy * (1 + 1e-6)


def test_place_is_deterministic(sampler, agent):
    task = sampler.sample("test", 25, 4)
    assert agent.place(task, "search", seed=3) == agent.place(task, "search", seed=3)


def test_bad_arguments(sampler, agent):
    task = sampler.sample("test", 10, 2)
    with pytest.raises(ValueError, match="mode"):
        agent.place(task, mode="beam")
    with pytest.raises(ValueError, match="num_samples"):
        agent.place(task, mode="search", num_samples=0)


def test_far_batch_size_warns(sampler, agent):
    task = sampler.sample("test", 10, 2, batch_size=64)
    with pytest.warns(UserWarning, match="batch size"):
        agent.table_costs(task)


def test_table_costs_order_the_mdp(sampler, agent):
    task = sampler.sample("test", 30, 4)
    costs = agent.table_costs(task)
    order = agent.mdp(task).order
    assert np.all(np.diff(costs[order]) <= 1e-9)


def test_refine_never_raises_the_predicted_cost_and_keeps_memory(sampler, agent):
    from torchrec_dreamshard.policy import refine

    task = sampler.sample("test", 30, 4, memory_factor=1.1)
    mdp = agent.mdp(task)
    start = np.asarray(agent.place(task))
    better = refine(mdp, start, 32)
    check_placement(task, better.tolist())
    assert agent.predict(task, better.tolist()).step_ms <= agent.predict(
        task, start.tolist()
    ).step_ms * (1 + 1e-5)
