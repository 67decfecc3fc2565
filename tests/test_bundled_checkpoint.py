"""A guard on the checkpoint that ships in the package: on a fixed set of small tasks, the
plan ``dreamshard plan`` makes by default is, by the checkpoint's own cost network, never
more than :data:`MARGIN` slower than the best classic heuristic's plan."""

from __future__ import annotations

import pytest

from torchrec_dreamshard.data import families
from torchrec_dreamshard.planner import baselines
from torchrec_dreamshard.policy.checkpoint import load_checkpoint
from torchrec_dreamshard.policy.split_search import plan_with_splits

MARGIN = 0.03  # the default plan's predicted step over the best heuristic's, at most 1.03x
POLICY_MARGIN = 0.10  # the policy's greedy roll-out alone, without the safety net
# (family, draw seed): small test draws (6 to 10 tables) of four families, two of which
# the default plan splits tables in (batch, zipf); about 5 s in all, most of it loading
TASKS = [("tight", 101), ("unequal", 100), ("batch", 100), ("zipf", 101)]


@pytest.fixture(scope="module")
def agent():
    return load_checkpoint(None)


def best_heuristic_ms(agent, task) -> float:
    """The lowest predicted step of the classic heuristics' plans (those that find one)."""
    found = []
    for name in baselines.HEURISTICS:
        try:
            found.append(agent.predict(task, baselines.place(name, task)).step_ms)
        except baselines.NoPlanError:
            continue
    assert found, "no heuristic found a plan"
    return min(found)


@pytest.mark.parametrize("family, seed", TASKS)
def test_default_plan_is_within_the_margin_of_the_best_heuristic(agent, family, seed):
    task = families.draw_task(family, "test", seed, num_tables=(6, 10))
    best = best_heuristic_ms(agent, task)
    # what `dreamshard plan TASK.json` does: the safe mode, column-wise splits allowed
    plan = plan_with_splits(agent, task, mode="safe", num_samples=4, seed=0)
    default_ms = agent.predict(plan.sharded.shards, plan.placement).step_ms
    assert default_ms <= (1 + MARGIN) * best, (family, default_ms / best)
    greedy_ms = agent.predict(task, agent.place(task, mode="greedy")).step_ms
    assert greedy_ms <= (1 + POLICY_MARGIN) * best, (family, greedy_ms / best)
