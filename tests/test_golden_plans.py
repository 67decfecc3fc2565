"""Comparing plans with recorded ones up to a relabelling of identical devices and a tie
(:mod:`harness.golden_plans`), as ``benchmarks/plan_regression.py
--check`` and ``tests/test_plan_regression_planner.py`` do."""

from __future__ import annotations

import pytest

from torchrec_dreamshard.data.sampler import TaskSampler
from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool

from harness.golden_plans import (
    TIE_RTOL,
    canonical_partition,
    placement_partition,
    plan_differences,
)


def test_ranks_on_other_hosts_or_of_other_memory_are_not_interchangeable():
    """Moving a table to the other host, or to a device of other memory, is no relabelling
    (only a tie in predicted cost could still accept it)."""
    two_hosts = [[0, 1], [2, 3]]
    a = canonical_partition({0: ["x"], 1: ["y"]}, two_hosts)
    assert canonical_partition({1: ["x"], 0: ["y"]}, two_hosts) == a
    assert canonical_partition({2: ["x"], 3: ["y"]}, two_hosts) == a  # the hosts swapped
    assert canonical_partition({0: ["x"], 2: ["y"]}, two_hosts) != a
    keys = {0: 1, 1: 1, 2: 2, 3: 2}
    b = canonical_partition({0: ["x"]}, [[0, 1, 2, 3]], keys)
    assert canonical_partition({1: ["x"]}, [[0, 1, 2, 3]], keys) == b
    assert canonical_partition({2: ["x"]}, [[0, 1, 2, 3]], keys) != b
    with pytest.raises(ValueError, match="in no host"):
        canonical_partition({4: ["x"]}, two_hosts)


def test_a_tie_passes_and_a_cost_change_of_the_same_plan_fails():
    part = canonical_partition({0: ["x"], 1: ["y"]}, [[0, 1]])
    other = canonical_partition({0: ["x", "y"]}, [[0, 1]])
    assert plan_differences((part, 5.0), (other, 5.0 * (1 + TIE_RTOL / 2))) == []
    assert plan_differences((part, 5.0), (other, 5.0 * (1 + 2 * TIE_RTOL)))
    assert plan_differences((part, 5.0), (part, 5.0 * (1 - 2 * TIE_RTOL)))
    assert plan_differences((part, None), (other, None))
    assert plan_differences((part, None), (part, None)) == []


def test_a_placement_compares_up_to_devices_of_equal_memory():
    assert placement_partition([0, 1, 1]) == placement_partition([1, 0, 0])
    assert placement_partition([0, 1, 1]) != placement_partition([0, 0, 1])
    assert placement_partition([0, 1, 1], [5, 5]) == placement_partition([1, 0, 0], [5, 5])
    assert placement_partition([0, 1, 1], [5, 6]) != placement_partition([1, 0, 0], [5, 6])
    assert placement_partition([0, 2, 2], [5, 6, 5]) == placement_partition([2, 0, 0], [5, 6, 5])


def test_the_agents_relabelled_plan_passes_and_a_worse_one_fails():
    """The bundled checkpoint's plan of a task, with two devices swapped and priced again,
    is no difference; a random plan that fits, priced by the same network, is one."""
    from torchrec_dreamshard.data.tasks import random_placement
    from torchrec_dreamshard.policy.checkpoint import load_checkpoint

    agent = load_checkpoint(None)
    task = TaskSampler(synthetic_pool(40, scale=CPU_POOL_SCALE), seed=4).sample(
        "test", 16, 4, memory_factor=2.0
    )
    plan = [int(d) for d in agent.place(task, mode="greedy", seed=0)]
    want = (placement_partition(plan, task.memory), agent.predict(task, plan).step_ms)
    swapped = [{0: 1, 1: 0}.get(d, d) for d in plan]
    assert swapped != plan
    got = (placement_partition(swapped, task.memory), agent.predict(task, swapped).step_ms)
    assert plan_differences(want, got) == []
    worse = random_placement(task, seed=0)
    cost = agent.predict(task, worse).step_ms
    assert cost > want[1] * (1 + 10 * TIE_RTOL), "the random plan is no worse"
    found = plan_differences(want, (placement_partition(worse, task.memory), cost))
    assert len(found) == 1 and "another plan, not a tie" in found[0], found
