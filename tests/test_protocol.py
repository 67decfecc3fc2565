"""The agent protocol and candidate sources: what users touch on an agent is declared, the
wrapper implements it explicitly, and plans from outside the policy are injected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from torchrec_dreamshard.calibration import CalibratingAgent
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task, random_placement
from torchrec_dreamshard.policy import (
    CandidateSource,
    DreamShard,
    FixedPlan,
    NoPlanError,
    PlacementAgent,
)

REPO = Path(__file__).resolve().parents[1]


def _task(n: int = 10, devices: int = 3, seed: int = 0) -> Task:
    rng = np.random.default_rng(seed)
    tables = [
        TableSpec(
            name=f"t{i}",
            rows=int(rng.integers(1000, 50_000)),
            dim=int(rng.choice([8, 32, 64])),
            pooling_factor=float(rng.uniform(1, 20)),
        )
        for i in range(n)
    ]
    memory = int(2 * sum(t.size_bytes for t in tables) / devices)
    return Task(tables=tables, num_devices=devices, memory_bytes=memory, batch_size=1024)


class _Failing:
    """A source that looks and finds nothing."""

    name = "broken"

    def propose(self, task: Task) -> list[int]:
        raise NoPlanError("found nothing")


class _Declining:
    """A source with nothing to offer for any task."""

    name = "shy"

    def __init__(self) -> None:
        self.asked = 0

    def propose(self, task: Task) -> None:
        self.asked += 1
        return None


def _members(protocol: type) -> set[str]:
    """The members a protocol declares (annotations, methods and properties)."""
    own = set(vars(protocol).get("__annotations__", {})) | set(vars(protocol))
    return {m for m in own if not m.startswith("_")}


# -- the protocol -------------------------------------------------------------------------


def test_protocol_declares_what_the_planner_split_search_and_calibration_touch():
    assert {
        "place",
        "prepare",
        "predict",
        "table_costs",
        "last_report",
        "without_measuring",
        "calibration_enabled",
        "meta",
    } <= _members(PlacementAgent)


@pytest.mark.parametrize("wrap", [None, "verify", "calibrate", "auto"])
def test_dreamshard_and_the_calibrating_agent_satisfy_the_protocol(wrap):
    from torchrec_dreamshard.calibration import CalibrationConfig
    from torchrec_dreamshard.calibration.auto import check_machine

    agent = DreamShard.untrained(seed=0)
    predicted = check_machine(agent, None).predicted_ms
    if wrap == "verify":
        agent = CalibratingAgent(agent, calibration=None, verify_k=2)
    elif wrap == "calibrate":
        agent = CalibratingAgent(agent, calibration=CalibrationConfig())
    elif wrap == "auto":  # this machine measures the reference kernel as predicted
        agent = CalibratingAgent(agent, calibration=CalibrationConfig(), auto=lambda: predicted)
    assert isinstance(agent, PlacementAgent)
    for member in _members(PlacementAgent):
        assert hasattr(agent, member), member
    assert isinstance(agent.without_measuring, PlacementAgent)
    # whether place calibrates the kernels on this machine: verifying alone does not, and
    # the automatic mode does not where the checkpoint prices the reference kernel right
    assert agent.calibration_enabled is (wrap == "calibrate")


def test_the_calibrating_agent_forwards_nothing_implicitly():
    assert not hasattr(CalibratingAgent, "__getattr__")
    wrapped = CalibratingAgent(DreamShard.untrained(seed=0), calibration=None)
    with pytest.raises(AttributeError):
        wrapped.cost_net  # noqa: B018  (a DreamShard member the protocol does not declare)


def test_the_calibrating_agent_delegates_each_member_to_its_current_agent():
    prior, task, shy = DreamShard.untrained(seed=0), _task(), _Declining()
    wrapped = CalibratingAgent(prior, calibration=None, verify_k=0)
    placement = wrapped.place(task, seed=1, sources=[shy, _Failing()])
    assert shy.asked == 1  # the sources reached the prior's safe mode
    assert wrapped.without_measuring is prior and wrapped.meta is prior.meta
    assert wrapped.last_report is prior.last_report and "broken" in prior.last_report.failed
    assert placement == prior.place(task, seed=1, sources=[shy, _Failing()])
    wrapped.last_report = None
    assert prior.last_report is None
    assert wrapped.predict(task, placement).step_ms == prior.predict(task, placement).step_ms
    np.testing.assert_array_equal(wrapped.table_costs(task), prior.table_costs(task))
    assert wrapped.last_outcome is not None and wrapped.last_outcome.placement == placement


# -- candidate sources --------------------------------------------------------------------


def test_an_injected_source_is_rated_like_every_other_candidate():
    task = _task()
    plan = random_placement(task, seed=11)
    agent = DreamShard.untrained(seed=0, sources=[FixedPlan("mine", tuple(plan))])
    assert isinstance(agent.sources[0], CandidateSource)
    named, failed = agent.candidates(task, seed=0)
    assert list(named)[-1] == "mine" and not failed  # after the policy's and heuristics'
    np.testing.assert_array_equal(named["mine"], plan)
    agent.place(task, seed=0)
    report = agent.last_report
    scorer = agent.scorer(task)
    fresh = {n: c for n, c in zip(named, scorer.candidates(named), strict=True)}
    for c in report.candidates:
        if not c.refined:  # an unrefined candidate's score is its plan's fresh rating
            assert c.score == pytest.approx(fresh[c.name].score, abs=1e-6)
    assert report.winner.score == min(c.score for c in report.candidates)
    names = {c.name for c in report.candidates}
    duplicate = any(np.array_equal(named[n], plan) for n in list(named)[:-1])
    assert ("mine" in names) != duplicate  # a plan someone else proposed keeps their name


def test_a_failing_source_is_reported_and_a_declining_one_left_out():
    task, shy = _task(), _Declining()
    agent = DreamShard.untrained(seed=0, sources=[_Failing(), shy])
    agent.place(task)
    assert agent.last_report.failed["broken"] == "found nothing"
    assert shy.asked == 1 and "shy" not in agent.last_report.failed
    assert "shy" not in {c.name for c in agent.last_report.candidates}
    assert agent.last_report.to_dict()["no_plan"]["broken"] == "found nothing"
    assert any("broken" in line and "no plan" in line for line in agent.last_report.lines())


def test_sources_of_one_call_replace_the_agents_own():
    task, shy = _task(), _Declining()
    agent = DreamShard.untrained(seed=0, sources=[_Failing()])
    agent.place(task, sources=[shy])
    assert "broken" not in agent.last_report.failed and shy.asked == 1
    agent.place(task, mode="search", sources=[shy])
    agent.place(task, mode="greedy", sources=[shy])
    assert shy.asked == 1  # only the safe mode asks sources


def test_bad_sources_are_refused_with_their_names():
    task = _task()
    with pytest.raises(TypeError, match="candidate source 0"):
        DreamShard.untrained(seed=0, sources=[object()])
    with pytest.raises(ValueError, match="'policy_greedy' is used twice"):
        DreamShard.untrained(seed=0).place(task, sources=[FixedPlan("policy_greedy", ())])
    with pytest.raises(ValueError, match="'mine'"):
        DreamShard.untrained(seed=0).place(task, sources=[FixedPlan("mine", (0,))])


def test_the_split_search_passes_sources_on():
    from torchrec_dreamshard.policy.protocol import PlaceSettings
    from torchrec_dreamshard.policy.split_search import plan_with_splits

    task, shy = _task(8, 2), _Declining()
    plan_with_splits(DreamShard.untrained(seed=0), task, PlaceSettings(sources=(shy,)))
    assert shy.asked >= 1


# -- layering -----------------------------------------------------------------------------

_PROBE = """
import json, sys
from torchrec_dreamshard.policy import DreamShard, FixedPlan
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
tables = [TableSpec(name=f"t{i}", rows=1000 * (i + 1), dim=16, pooling_factor=2.0)
          for i in range(6)]
task = Task(tables=tables, num_devices=2, memory_bytes=10**8, batch_size=256)
DreamShard.untrained(seed=0, sources=[FixedPlan("mine", (0, 1) * 3)]).place(task)
print(json.dumps(sorted(sys.modules)))
"""


def test_the_policy_imports_nothing_of_torchrecs_planner():
    """Importing the policy and planning in safe mode loads neither TorchRec's planner
    nor our adapter to it, nor the baselines that wrap it, nor our planner."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, check=True
    )
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    banned = ("torchrec.distributed.planner", "torchrec_dreamshard.planner")
    assert not [m for m in loaded if m.startswith(banned)]
    assert "torchrec_dreamshard.policy.heuristics" in loaded


# -- the planner side's TorchRec source ---------------------------------------------------


def _torchrecs_own_placement(task: Task) -> list[int]:
    """The rank TorchRec's own ``EmbeddingShardingPlanner`` gives each table of ``task``
    (table-wise on the fused kernel, its default topology, storage and reservation),
    built here from TorchRec's public API alone."""
    import torch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import ParameterConstraints, Topology
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    configs = [
        EmbeddingBagConfig(
            name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[f"f_{t.name}"]
        )
        for t in task.tables
    ]
    constraints = {
        t.name: ParameterConstraints(
            sharding_types=["table_wise"],
            compute_kernels=["fused"],
            pooling_factors=[t.pooling_factor],
        )
        for t in task.tables
    }
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=task.num_devices, compute_device="cpu"),
        batch_size=task.batch_size // task.num_devices,
        constraints=constraints,
        debug=False,
    )
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    plan = planner.plan(ebc, [EmbeddingBagCollectionSharder()]).plan[""]
    return [plan[t.name].ranks[0] for t in task.tables]


@pytest.mark.usefixtures("quiet")
def test_torchrecs_candidate_is_torchrecs_plan_as_it_ships_and_ours_where_that_has_none():
    """The safety net's TorchRec candidate is the plan TorchRec's own planner makes, with
    its memory accounting, wherever that finds a plan (even where our accounting would
    place the tables elsewhere), and still a plan, within every device's memory by our
    accounting (weights only), on a task TorchRec's default accounting finds no plan for.
    Handed memory a storage reservation already left, it reserves nothing more."""
    from torchrec_dreamshard.data.tasks import check_placement
    from torchrec_dreamshard.evaluation.placers import place
    from torchrec_dreamshard.planner.stages.candidates import (
        TorchRecCandidate,
        default_sources,
        torchrec_placement,
    )

    assert [s.name for s in default_sources()] == ["torchrec_ours"]
    tables = _task(8, 2).tables
    loose = Task(tables=tables, num_devices=2, memory_bytes=10**10, batch_size=1024)
    torchrec = _torchrecs_own_placement(loose)
    assert torchrec != place("size_greedy", loose)  # the check tells them apart
    assert TorchRecCandidate().propose(loose) == torchrec
    named, _ = DreamShard.untrained(seed=0, sources=default_sources()).candidates(loose)
    np.testing.assert_array_equal(named["torchrec_ours"], torchrec)

    weights = sum(t.size_bytes for t in tables)
    # TorchRec's reservation binds here: the two accountings place the tables differently
    middle = Task(tables=tables, num_devices=2, memory_bytes=int(0.75 * weights), batch_size=1024)
    shipped = place("torchrec", middle)
    assert shipped != place("torchrec_ours", middle)
    assert TorchRecCandidate().propose(middle) == shipped
    unreserved = torchrec_placement(middle, accounting="unreserved")
    assert TorchRecCandidate(reserved=True).propose(middle) == unreserved
    assert default_sources(reserved=True)[0].reserved

    tight = Task(tables=tables, num_devices=2, memory_bytes=int(0.6 * weights), batch_size=1024)
    with pytest.raises(NoPlanError, match="TorchRec"):
        place("torchrec", tight)
    check_placement(tight, TorchRecCandidate().propose(tight))
    with pytest.raises(ValueError, match="accounting"):
        torchrec_placement(tight, accounting="ours")


def test_torchrecs_candidate_declines_large_tasks_and_reports_failures(monkeypatch):
    from torchrec_dreamshard.planner.stages import candidates
    from torchrec_dreamshard.planner.stages.candidates import TorchRecCandidate
    from torchrec_dreamshard.policy import is_large

    def no_plan(task, seed=0, accounting="torchrec"):
        raise NoPlanError("TorchRec's planner found no plan: test")

    monkeypatch.setattr(candidates, "torchrec_placement", no_plan)
    small = _task(8, 2)
    agent = DreamShard.untrained(seed=0, sources=[TorchRecCandidate()])
    agent.place(small)
    assert agent.last_report.failed["torchrec_ours"].startswith("TorchRec's planner")
    tables = [TableSpec(name=f"t{i}", rows=100, dim=8, pooling_factor=1.0) for i in range(2001)]
    large = Task(tables=tables, num_devices=10, memory_bytes=10**9, batch_size=64)
    assert is_large(large) and TorchRecCandidate().propose(large) is None
