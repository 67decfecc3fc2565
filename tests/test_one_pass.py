"""``DreamShardPlanner.plan()`` as one pass of values (issue 48): no component reads state
another wrote on a shared object, TorchRec's loop runs once per plan (a kept other plan
included) and every stats logger logs once, for the plan returned; the enumerator prices
with the agent the loop plans with."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.stats import EmbeddingStats
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from torchrec_dreamshard.calibration.calibration_result import CalibrationResult
from torchrec_dreamshard.calibration.planning import PlanOutcome
from torchrec_dreamshard.planner import DreamShardPlanner
from torchrec_dreamshard.planner.stages.option_kinds import is_policy_option
from torchrec_dreamshard.planner.steps import verify_step
from torchrec_dreamshard.planner.steps.plan_agent import PlanAgent
from torchrec_dreamshard.policy import DreamShard
from torchrec_dreamshard.profile import build

PACKAGE = Path(__file__).resolve().parent.parent / "torchrec_dreamshard"
SHARDERS = [EmbeddingBagCollectionSharder()]
pytestmark = pytest.mark.usefixtures("quiet")


def model(n: int = 6) -> torch.nn.Module:
    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=16, num_embeddings=500 * (i + 1), feature_names=[f"f{i}"]
        )
        for i in range(n)
    ]
    out = torch.nn.Module()
    out.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    return out


def table_wise(n: int = 6) -> dict[str, ParameterConstraints]:
    return {f"t{i}": ParameterConstraints(sharding_types=["table_wise"]) for i in range(n)}


class Counting(EmbeddingStats):
    """A user's stats logger that counts its calls and keeps what it was handed."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict] = []

    def log(self, *args, **kwargs) -> None:
        self.calls.append(kwargs)


@pytest.fixture
def loops(monkeypatch):
    """How many times TorchRec's planning loop ran."""
    runs = []
    real = EmbeddingShardingPlanner.plan

    def counted(self, module, sharders):
        if isinstance(self, DreamShardPlanner):  # the baseline's own planner is apart
            runs.append(module)
        return real(self, module, sharders)

    monkeypatch.setattr(EmbeddingShardingPlanner, "plan", counted)
    return runs


def test_the_agent_holds_no_back_channel_and_no_step_is_set_after_it_is_built():
    """The attributes the partitioner once left on the agent for the verification to read
    (``last_task``, ``last_chosen``, ``last_label``), the pin and the frozen mode are
    gone; and no module of the planner's one pass assigns an attribute on a component or
    an agent it holds (``self.x.y = ...``, ``agent.y = ...``), but the policy protocol's
    ``last_report`` (the safety net's report, which the split search restores)."""
    agent = PlanAgent(DreamShard.untrained(seed=0))
    gone = ("last_task", "last_chosen", "last_label", "pin", "freeze", "frozen", "_pinned")
    assert not [name for name in gone if hasattr(agent, name)]
    from torchrec_dreamshard.calibration import CalibratingAgent

    assert not [name for name in gone if hasattr(CalibratingAgent, name)]
    offenders = []
    rooms = ("planner", "calibration", "verification", "profile")
    for path in sorted(p for room in rooms for p in (PACKAGE / room).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                if not isinstance(target, ast.Attribute):
                    continue
                if held_object(target.value) and target.attr != "last_report":
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} .{target.attr}")
    assert offenders == [], offenders


HELD = {"agent", "wrapper", "planner", "steps", "placer", "proposer", "partitioner", "stats"}


def held_object(owner: ast.expr) -> bool:
    """Whether an assignment's owner is a component or agent held by another: an
    attribute of ``self`` (``self._steps``), or a name of one (``agent``, ``wrapper``)."""
    if isinstance(owner, ast.Attribute):
        return isinstance(owner.value, ast.Name) and owner.value.id == "self"
    return isinstance(owner, ast.Name) and owner.id in HELD


def test_the_scan_finds_an_attribute_set_on_a_held_object():
    source = "self._steps.sources = x\nwrapper.last_task = t\nself.own = 1\nshard.rank = 0\n"
    found = [
        t.attr
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Attribute) and held_object(t.value)
    ]
    assert found == ["sources", "last_task"]


def test_torchrec_s_loop_runs_once_and_the_stats_log_once(agent, loops):
    counting = Counting()
    planner = DreamShardPlanner(
        Topology(world_size=2, compute_device="cpu"),
        64,
        stats=[counting],
        constraints=table_wise(),
        agent=agent,
        calibrate=False,
    )
    plan = planner.plan(model(), SHARDERS)
    assert len(loops) == 1
    assert len(counting.calls) == 1 and counting.calls[0]["sharding_plan"] is plan
    assert counting.calls[0]["best_plan"] == planner.best_options


def test_a_plan_the_verification_keeps_is_built_without_a_second_loop(agent, loops, monkeypatch):
    """Where the verification keeps another placement, the plan returned places the
    tables there, TorchRec's loop has run once, and the stats log that plan once."""
    seen = []

    def keeps_another(agent, task, chosen, label, sources, settings, measure=None, progress=False):
        seen.append((task, list(chosen)))
        other = [(d + 1) % task.num_devices for d in chosen]
        return PlanOutcome(other, agent, chosen=list(chosen))

    monkeypatch.setattr(verify_step, "verify_chosen", keeps_another)
    counting = Counting()
    planner = DreamShardPlanner(
        Topology(world_size=2, compute_device="cpu"),
        64,
        stats=[counting],
        constraints=table_wise(),
        agent=agent,
        calibrate=False,
        verify=1,
    )
    plan = planner.plan(model(), SHARDERS)
    assert len(loops) == 1 and len(seen) == 1
    task, chosen = seen[0]
    kept = planner.last_verdict.kept
    assert kept == {t.name: (d + 1) % 2 for t, d in zip(task.tables, chosen, strict=True)}
    ranks = {name: ps.ranks[0] for name, ps in plan.plan["ebc"].items()}
    assert {f"ebc.{n}": r for n, r in ranks.items()} == kept
    assert {o.fqn: o.shards[0].rank for o in planner.best_options} == kept
    assert len(counting.calls) == 1 and counting.calls[0]["sharding_plan"] is plan


def test_the_enumerator_prices_with_the_calibrated_agent(agent, monkeypatch):
    """Calibration runs in the profile step before TorchRec's loop, after a dry run of the
    enumerator names its tables; the loop's search space is priced by the calibrated
    agent, not by the one that priced the dry run (TorchRec's search-space cache kept
    the checkpoint's prices before)."""
    calibrated = DreamShard.untrained(seed=7)

    def fake_calibrate(prior, task, config, sources=None):
        return CalibrationResult(
            agent=calibrated,
            measured=len(task.tables),
            reused=0,
            skipped=0,
            seconds=0.0,
            measure_s=0.0,
            samples=len(task.tables),
            before={},
            after={},
            store="none",
        )

    monkeypatch.setattr(build, "calibrate", fake_calibrate)
    planner = DreamShardPlanner(
        Topology(world_size=2, compute_device="cpu"),
        64,
        constraints=table_wise(),
        agent=agent,
        calibrate=5.0,
    )
    planner.plan(model(), SHARDERS)
    assert planner.adaptation["calibrated"]
    bound = planner.agent.current
    assert bound is not agent
    ours = [o for o in planner.best_options if is_policy_option(o)]
    assert ours
    from torchrec_dreamshard.data.tasks import Task

    specs = [planner.table_specs(o) for o in ours]
    task = Task(tables=specs, num_devices=2, memory_bytes=[10**12] * 2, batch_size=128)
    priced = bound.table_costs(task)
    prior = agent.table_costs(task)
    got = [o.shards[0].perf.total for o in ours]
    assert got == pytest.approx(list(priced), rel=1e-4)
    assert got != pytest.approx(list(prior), rel=1e-4)


def test_the_verified_task_holds_every_candidate_the_safety_net_placed(agent):
    """The verification's task gives each device at least what the chosen placement and
    each of the safety net's candidates put there (the partitioner may have raised a
    share to admit TorchRec's plan), so every candidate it measures fits."""
    from types import SimpleNamespace

    from torchrec_dreamshard.planner.adapters.torchrec_adapter import planner_reserved_topology
    from torchrec_dreamshard.planner.steps.verify_step import policy_choice

    planner = DreamShardPlanner(
        Topology(world_size=2, compute_device="cpu", ddr_cap=600_000),
        64,
        constraints=table_wise(),
        agent=agent,
        calibrate=False,
    )
    planner.plan(model(), SHARDERS)
    options, constraint = planner.best_options, planner_reserved_topology(planner)
    piled = SimpleNamespace(placement=[0] * len(options), label="piled")
    report = SimpleNamespace(candidates=[piled], winner=piled)
    choice = policy_choice(options, constraint, planner.table_specs, 128, report)
    assert choice is not None and choice.label == "piled"
    assert choice.task.memory[0] >= sum(t.size_bytes for t in choice.task.tables)
    alone = policy_choice(options, constraint, planner.table_specs, 128)
    assert alone.task.memory[0] < choice.task.memory[0]  # the shares alone hold less
