"""The planner's baseline is TorchRec's own plan of the user's inputs
(:class:`~torchrec_dreamshard.planner.candidates.TorchRecOwnPlan`): found in the memory
TorchRec counts, offered to the safety net, and the plan where the policy's placements
keep overflowing TorchRec's storage estimate."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import NoPlanError, Task
from torchrec_dreamshard.evaluation.default_planning import (
    task_placement,
    whole_table_constraints,
)
from torchrec_dreamshard.evaluation.task_draws import roster
from torchrec_dreamshard.planner import DreamShardPlanner
from torchrec_dreamshard.planner.candidates import (
    TORCHREC_CANDIDATE,
    TorchRecOwnPlan,
    torchrec_placement,
)
from torchrec_dreamshard.planner.task_inputs import task_inputs
from torchrec_dreamshard.planner.torchrec_adapter import quiet_torchrec


def _planned(task: Task, tmp_path) -> DreamShardPlanner:
    """``DreamShardPlanner`` on ``task``'s whole tables, nothing measured."""
    inputs = task_inputs(task)
    arguments = inputs.planner_arguments()
    arguments["constraints"] = whole_table_constraints(inputs)
    planner = DreamShardPlanner(**arguments, measure=False, cache_dir=tmp_path)
    with quiet_torchrec():
        planner.plan(inputs.model, [EmbeddingBagCollectionSharder()])
    return planner


def _own(planner: DreamShardPlanner) -> TorchRecOwnPlan:
    (own,) = [s for s in planner.partitioner.placer.how.sources if isinstance(s, TorchRecOwnPlan)]
    return own


def test_the_baseline_on_wide_tables_is_torchrecs_own_plan(tmp_path):
    """On the held-out ``wide`` task (tables of up to 316 MB on 375 MB devices) TorchRec's
    planner run in the policy's memory view (each device's share scaled to weights) found
    no plan, and the old candidate fell back to counting weights, another plan. The
    planner's baseline, as the safety net weighed it, is now TorchRec's plan as it ships."""
    [(_, task)] = roster(["wide"], 1)
    shipped = torchrec_placement(task, accounting="torchrec")
    planner = _planned(task, tmp_path)
    [(names, remembered)] = _own(planner).plans.items()
    assert task_placement(task, dict(zip(names, remembered, strict=True))) == shipped
    report = planner.partitioner.last_report
    [offered] = [c for c in report.candidates if c.name == TORCHREC_CANDIDATE and not c.refined]
    by_name = dict(zip(names, (int(d) for d in offered.placement), strict=True))
    assert task_placement(task, by_name) == shipped


def _overflowing_partitioner(monkeypatch, placements):
    """A partitioner whose policy returns ``placements`` in turn, with TorchRec's estimate
    of every table 100 kB (its weights: 64 kB)."""
    from torchrec_dreamshard.planner import partitioners
    from torchrec_dreamshard.planner.placement import PolicyPlacer

    class Scripted:
        last_report = None

        def __init__(self):
            self.memory: list[list[int]] = []

        def place(self, task, mode="safe", num_samples=4, seed=0, sources=None):
            self.memory.append(list(task.memory))
            return placements[min(len(self.memory), len(placements)) - 1]

    specs = {
        f"t{i}": TableSpec(name=f"t{i}", rows=1000, dim=16, pooling_factor=1.0) for i in range(4)
    }
    monkeypatch.setattr(partitioners, "option_bytes", lambda option, tier: 100_000)
    agent = Scripted()
    partitioner = partitioners.DreamShardPartitioner(
        placer=PolicyPlacer(agent, 64), spec_fn=lambda option: specs[option.fqn]
    )
    ours = [SimpleNamespace(fqn=name, shards=[SimpleNamespace(rank=None)]) for name in specs]
    return partitioner, ours, agent, list(specs.values())


def test_torchrecs_plan_is_the_plan_where_the_policy_keeps_overflowing(monkeypatch):
    from torchrec_dreamshard.planner.partitioners import MAX_MEMORY_ROUNDS

    partitioner, ours, agent, specs = _overflowing_partitioner(monkeypatch, [[0, 0, 0, 1]])
    left = [250_000, 1_000_000]
    placed = partitioner._place_policy(ours, left, "ddr", {})
    assert len(agent.memory) == MAX_MEMORY_ROUNDS
    task = Task(tables=specs, num_devices=2, memory_bytes=left, batch_size=64)
    expected = torchrec_placement(task, accounting="unreserved")
    assert [o.shards[0].rank for o in placed] == expected


def test_the_first_shares_admit_torchrecs_plan_and_later_ones_may_not(monkeypatch):
    """The policy's first shares are raised to the weights TorchRec's plan puts on each
    device; a share shrunk after an overflow is not, and the baseline then declines the
    policy's task with its reason rather than offering a plan that does not fit it."""
    partitioner, ours, agent, specs = _overflowing_partitioner(
        monkeypatch, [[0, 0, 0, 1], [0, 1, 1, 1]]
    )
    left = [250_000, 1_000_000]
    partitioner._place_policy(ours, left, "ddr", {})
    task = Task(tables=specs, num_devices=2, memory_bytes=left, batch_size=64)
    expected = torchrec_placement(task, accounting="unreserved")
    weights = [
        sum(s.size_bytes for s, d in zip(specs, expected, strict=True) if d == k) for k in (0, 1)
    ]
    first, second = agent.memory[:2]
    assert all(cap >= w for cap, w in zip(first, weights, strict=True))
    own = partitioner.placer.how.sources[0]
    assert second[0] < first[0] and second[1] == first[1]  # device 0's share shrank
    below = Task(
        tables=specs, num_devices=2, memory_bytes=[weights[0] - 1, second[1]], batch_size=64
    )
    with pytest.raises(NoPlanError, match=r"devices \[0\] than the policy's share"):
        own.propose(below)
    assert (
        own.propose(Task(tables=specs, num_devices=2, memory_bytes=first, batch_size=64))
        == expected
    )


def test_torchrecs_plan_is_the_plan_where_the_shares_leave_a_table_no_room(monkeypatch):
    """A placement the policy cannot make in its shares (a storage ``PlannerError`` from
    the placer) ends the memory rounds; TorchRec's own plan, which fits, is the plan."""
    from torchrec.distributed.planner.types import PlannerError, PlannerErrorType

    from torchrec_dreamshard.planner.placement import PolicyPlacer

    partitioner, ours, agent, specs = _overflowing_partitioner(monkeypatch, [[0, 0, 0, 1]])

    def no_room(self, specs, memory, widths):
        agent.memory.append(list(memory))
        raise PlannerError("no room", PlannerErrorType.INSUFFICIENT_STORAGE)

    monkeypatch.setattr(PolicyPlacer, "place", no_room)
    left = [250_000, 1_000_000]
    placed = partitioner._place_policy(ours, left, "ddr", {})
    task = Task(tables=specs, num_devices=2, memory_bytes=left, batch_size=64)
    assert [o.shards[0].rank for o in placed] == torchrec_placement(task, accounting="unreserved")
    assert len(agent.memory) == 1


def test_the_heuristics_are_judged_within_torchrecs_storage_estimate():
    """The benchmarks' check of a plan against TorchRec's storage estimate: every table
    counts at least its weights, TorchRec's own plan (nothing reserved) passes, and the
    weights-only size heuristic's plan of ``wide`` does not: what the default planner,
    bound by TorchRec's estimate, may not plan."""
    from torchrec_dreamshard.evaluation.default_planning import (
        fits_torchrec_storage,
        torchrec_table_storage,
    )
    from torchrec_dreamshard.policy.heuristics import HEURISTICS, proxy_greedy

    [(_, task)] = roster(["wide"], 1)
    storage = torchrec_table_storage(task)
    assert all(s > t.size_bytes for s, t in zip(storage, task.tables, strict=True))
    own = torchrec_placement(task, accounting="unreserved")
    assert fits_torchrec_storage(task, own, storage)
    fits = {
        name: fits_torchrec_storage(task, proxy_greedy(task, proxy), storage)
        for name, proxy in HEURISTICS.items()
    }
    assert not all(fits.values()), fits
