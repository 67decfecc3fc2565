"""The cost of a sharding path: charged once per path a typed plan runs, measured on real
ranks started as fresh interpreters, kept in the machine profile, gated by the plan's
budget, and what it changes in the type choice (tiny tables all data-parallel once the
table-wise path costs more than they save)."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import CPU_DENSE_LIKE, GLOO_LIKE
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.sharding_plan import get_default_sharders

from torchrec_dreamshard.calibration.auto import check_machine
from torchrec_dreamshard.cost.comm_topology import CommTopology
from torchrec_dreamshard.cost.plans import plan_breakdown, plan_cost
from torchrec_dreamshard.cost.sharding import PATH_KIND, CostContext, TableChoice
from torchrec_dreamshard.cost.sharding_path_model import ShardingPathModel
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.evaluation.dmp_step import sharding_type_counts, table_shardings
from torchrec_dreamshard.evaluation.step_model import StepDLRM
from torchrec_dreamshard.measure.sharding_path import PathTimings, time_sharding_path
from torchrec_dreamshard.planner import DreamShardPlanner
from torchrec_dreamshard.planner.adapters.topology import torchrec_topology
from torchrec_dreamshard.planner.type_choice.model_needs import sharding_paths_may_change
from torchrec_dreamshard.policy.checkpoint import load_checkpoint
from torchrec_dreamshard.profile.budget import Budget
from torchrec_dreamshard.profile.build import (
    MIN_PATH_S,
    VERIFY_RESERVE,
    ProfileRequest,
    build_profile,
)
from torchrec_dreamshard.profile.machine_profile import MachineProfile
from torchrec_dreamshard.profile.stamp import MachineStamp
from torchrec_dreamshard.ranks.spawn import exit_spawned_rank, free_port, local_process_group
from torchrec_dreamshard.verification.round_cost import measurement_seconds, verification_seconds

from harness.step_families import family_spec

pytestmark = pytest.mark.usefixtures("quiet")

TABLES = [TableSpec(name=f"t{i}", rows=100, dim=8, pooling_factor=1.0) for i in range(4)]


def kernel(tables, batch):
    return 0.01 * len(tables), 0.02 * len(tables)


def ctx(path_ms: float = 0.0, world: int = 2) -> CostContext:
    return CostContext(
        batch_size=512,
        topology=CommTopology(world_size=world),
        collectives=GLOO_LIKE,
        kernel_ms=kernel,
        dense_kernel=CPU_DENSE_LIKE,
        path_ms=path_ms,
    )


def choices(*types: str, pooled: tuple[bool, ...] | None = None) -> list[TableChoice]:
    pooled = pooled or (True,) * len(types)
    ranks = {"table_wise": (0,), "data_parallel": (), "row_wise": ()}
    return [
        TableChoice(table=t, sharding_type=k, ranks=ranks[k], pooled=p)
        for t, k, p in zip(TABLES, types, pooled, strict=True)
    ]


def paid(plan: list[TableChoice], path_ms: float) -> float:
    """What charging ``path_ms`` adds to the plan's step."""
    return plan_cost(plan, ctx(path_ms)).step_ms - plan_cost(plan, ctx()).step_ms


def test_a_plan_pays_each_sharding_path_once_and_data_parallel_none():
    dp = ("data_parallel",) * 4
    assert paid(choices(*dp), 5.0) == 0.0
    assert paid(choices("table_wise", *dp[1:]), 5.0) == pytest.approx(5.0)
    assert paid(choices("table_wise", "table_wise", "table_wise", "data_parallel"), 5.0) == (
        pytest.approx(5.0)
    )  # one path however many tables
    assert paid(choices("table_wise", "row_wise", "data_parallel", "data_parallel"), 5.0) == (
        pytest.approx(10.0)
    )
    pooled_and_sequence = choices(*("table_wise",) * 4, pooled=(True, True, False, False))
    assert paid(pooled_and_sequence, 5.0) == pytest.approx(10.0)  # two modules, two paths
    # the breakdown names it as a source of its own, so the type choice's margin sees it
    parts = plan_breakdown(choices("table_wise", *dp[1:]), ctx(5.0)).at_slowest()
    assert parts[PATH_KIND] == pytest.approx(5.0)
    assert PATH_KIND not in plan_breakdown(choices(*dp), ctx(5.0)).at_slowest()


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_a_path_cost_must_be_finite_and_not_negative(bad):
    with pytest.raises(ValueError, match="path_ms must be a finite number >= 0"):
        ctx(bad)


def model_of(deltas: list[float], dp_ms: float = 3.0) -> ShardingPathModel:
    timings = PathTimings(
        data_parallel=tuple(dp_ms for _ in deltas),
        one_table_wise=tuple(dp_ms + d for d in deltas),
    )
    return ShardingPathModel(timings, source="test")


def test_the_path_cost_is_the_median_difference_less_what_the_collectives_price():
    m = model_of([4.0, 6.0, 5.0, 5.5, 4.5])
    assert m.median_ms == pytest.approx(5.0)
    modelled = m.modelled_ms(GLOO_LIKE)
    assert modelled > 0  # the three all-to-alls of the path table
    assert m.unmodelled_ms(GLOO_LIKE) == pytest.approx(5.0 - modelled)
    assert model_of([0.1, 0.2, 0.1]).unmodelled_ms(GLOO_LIKE) == 0.0  # never negative
    # the median's standard error shrinks with the rounds and grows with their spread
    assert model_of([5.0] * 8).error_ms == 0.0
    assert model_of([4.0, 6.0] * 8).error_ms < model_of([4.0, 6.0] * 2).error_ms
    assert model_of([3.0, 7.0] * 4).error_ms > model_of([4.0, 6.0] * 4).error_ms
    back = ShardingPathModel.from_dict(m.to_dict())
    assert back == m
    with pytest.raises(ValueError, match="version"):
        ShardingPathModel.from_dict({**m.to_dict(), "version": 99})
    with pytest.raises(ValueError, match="same number of rounds"):
        PathTimings(data_parallel=(1.0,), one_table_wise=(1.0, 2.0))


def test_a_profile_keeps_the_path_cost_and_an_older_file_loads_without_it(tmp_path):
    stamp = MachineStamp.here("cpu", 2, 2)
    path = model_of([4.0, 5.0, 6.0])
    profile = MachineProfile(stamp=stamp, collectives=GLOO_LIKE, sharding_path=path)
    profile.save(tmp_path / "p.profile")
    loaded = MachineProfile.load(tmp_path / "p.profile")
    assert loaded.sharding_path == path
    assert loaded.summary()["sharding_path_ms"] == pytest.approx(5.0)
    payload = torch.load(tmp_path / "p.profile", weights_only=True)
    del payload["sharding_path"]  # as written before the path was measured
    torch.save(payload, tmp_path / "old.profile")
    assert MachineProfile.load(tmp_path / "old.profile").sharding_path is None


def request(asked: list[bool]) -> ProfileRequest:
    def sharding_path(may_measure: bool) -> ShardingPathModel | None:
        asked.append(may_measure)
        return model_of([5.0]) if may_measure else None

    return ProfileRequest(
        stamp=MachineStamp.here("cpu", 2, 2), reference=lambda: None, sharding_path=sharding_path
    )


PRIOR = load_checkpoint(None)


def test_the_path_is_timed_only_while_the_budget_has_room_for_it(clock):
    asked: list[bool] = []
    roomy = build_profile(PRIOR, request(asked), Budget(MIN_PATH_S + 5, clock=clock))
    assert asked == [True] and roomy.sharding_path is not None
    clock.advance(10.0)
    tight = Budget(MIN_PATH_S + 5, clock=clock)
    clock.advance(6.0)  # less than MIN_PATH_S left
    short = build_profile(PRIOR, request(asked), tight)
    assert asked == [True, False] and short.sharding_path is None
    assert any("sharding path not timed" in n for n in short.notes)


def test_a_slow_machine_keeps_the_verification_its_measurements_first(clock):
    """Where the reference kernel runs much slower than the checkpoint prices it, the
    verification's fewest measurements need more than the usual share: the share is raised
    before the type choice's timings spend it, so the path goes untimed."""
    tables = [TableSpec(name=f"t{i}", rows=10_000, dim=32, pooling_factor=5.0) for i in range(8)]
    task = Task(tables=tables, num_devices=2, memory_bytes=[10**9] * 2, batch_size=512)
    predicted = check_machine(PRIOR, None).predicted_ms
    one = measurement_seconds(PRIOR, task, [i % 2 for i in range(8)])
    budget_s = 25.0
    assert verification_seconds(one) + 1.5 <= VERIFY_RESERVE * budget_s  # as priced: the share

    def slow_by(factor: float, asked: list[bool]) -> ProfileRequest:
        return dataclasses.replace(
            request(asked),
            reference=lambda: (predicted[0] * factor, predicted[1] * factor),
            task=lambda: task,
            verifies=lambda calibrates: True,
        )

    asked: list[bool] = []
    priced = build_profile(PRIOR, slow_by(1.0, asked), Budget(budget_s, clock=clock))
    assert asked == [True] and not any("verification's share" in n for n in priced.notes)
    # one measurement 2.5 s here: six need 18.2 s with the loop, leaving the path < 8 s
    slow = build_profile(PRIOR, slow_by(2.5 / one, asked), Budget(budget_s, clock=clock))
    assert asked == [True, False], "the path was timed out of the verification's share"
    assert any("verification's share raised to 18.2 s" in n for n in slow.notes), slow.notes


def tiny_plan(path: ShardingPathModel | None) -> dict[str, int]:
    spec = family_spec("tiny", 512)
    topology = torchrec_topology(2, "cpu")
    profile = MachineProfile(
        stamp=MachineStamp.here("cpu", 2, 2),
        collectives=GLOO_LIKE,
        dense_kernel=CPU_DENSE_LIKE,
        sharding_path=path,
    )
    planner = DreamShardPlanner(
        topology=topology, batch_size=512, constraints=spec.planner_constraints(), profile=profile
    )
    plan = planner.plan(StepDLRM(spec, torch.device("meta")), get_default_sharders())
    return sharding_type_counts(table_shardings(plan))


def test_tiny_tables_all_go_data_parallel_once_the_table_wise_path_is_priced():
    # under the tests' fixed models, replicating the 100 tiny tables costs a step about
    # 15 ms more in all-reduce and dense kernel than table-wise: a path cost below that
    # keeps them table-wise, one above it saves the whole path
    without = tiny_plan(None)
    assert without.get("table_wise", 0) > 0
    assert tiny_plan(model_of([6.0, 6.5, 5.5, 6.2, 5.8])) == without
    assert tiny_plan(model_of([20.0, 21.0, 19.5, 20.5, 19.0])) == {"data_parallel": 100}


SCRIPT = """
import sys
from pathlib import Path
with open(sys.argv[1], "a") as f:  # no __main__ guard: a rank re-importing it would run this
    f.write("ran\\n")
from torchrec_dreamshard.measure.sharding_path import time_sharding_path
t = time_sharding_path(rounds=2, warmup=1, steps=2)
Path(sys.argv[2]).write_text(repr((t.data_parallel, t.one_table_wise)))
"""


def test_real_ranks_time_the_path_and_a_script_without_a_main_guard_runs_once(tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    runs, out = tmp_path / "runs.txt", tmp_path / "out.txt"
    done = subprocess.run(
        [sys.executable, str(script), str(runs), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert runs.read_text() == "ran\n"  # the ranks are fresh interpreters
    dp, tw = eval(out.read_text())  # noqa: S307 - our own repr of two tuples of floats
    assert len(dp) == len(tw) == 2
    assert all(math.isfinite(x) and x > 0 for x in (*dp, *tw))


def test_the_path_is_never_timed_from_inside_a_distributed_job(monkeypatch):
    from torchrec_dreamshard.ranks import spawn

    monkeypatch.setattr(spawn, "in_distributed_job", lambda: True)
    with pytest.raises(ValueError, match="inside a distributed job"):
        time_sharding_path()


def tiny_model():
    spec = family_spec("tiny", 512)
    return spec, StepDLRM(spec, torch.device("meta"))


def test_the_path_is_timed_only_where_a_plan_may_run_another_number_of_paths():
    spec, model = tiny_model()
    sharders, constraints = get_default_sharders(), spec.planner_constraints()
    roomy = torchrec_topology(2, "cpu")
    assert sharding_paths_may_change(sharders, model, constraints, roomy)
    # one table held to table-wise: a table-wise path in every plan (no row-wise on CPU)
    held = dict(constraints)
    name = spec.bags[0].name
    held[name] = dataclasses.replace(held[name], sharding_types=["table_wise"])
    assert not sharding_paths_may_change(sharders, model, held, roomy)
    # the tables' weights do not fit one device: not every table can be replicated
    weights = sum(t.rows * t.dim for t in spec.bags) * 2
    tight = torchrec_topology(2, "cpu", ddr_cap=weights - 1)
    assert not sharding_paths_may_change(sharders, model, constraints, tight)
    # row-wise allowed somewhere (a sharder offering it): a path may be added beside
    assert sharding_paths_may_change([RowWiseOffered()], model, held, tight)


class RowWiseOffered(EmbeddingBagCollectionSharder):
    """TorchRec's sharder of pooled collections, offering row-wise on CPU too."""

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return [*super().sharding_types(compute_device_type), "row_wise"]


def test_a_plan_whose_paths_cannot_change_never_times_the_path(cold_cache, monkeypatch):
    from torchrec_dreamshard.planner.steps import machine_sources

    asked: list[str] = []

    def load(**kw):
        asked.append("load")
        return model_of([20.0] * 5)

    monkeypatch.setattr(machine_sources, "load_sharding_path_model", load)
    spec, model = tiny_model()
    held = dict(spec.planner_constraints())
    name = spec.bags[0].name
    held[name] = dataclasses.replace(held[name], sharding_types=["table_wise"])
    planner = DreamShardPlanner(
        topology=torchrec_topology(2, "cpu"), batch_size=512, constraints=held
    )
    planner.plan(model, get_default_sharders())
    assert asked == []  # neither timed nor (nothing cached) loaded
    planner = DreamShardPlanner(
        topology=torchrec_topology(2, "cpu"),
        batch_size=512,
        constraints=spec.planner_constraints(),
    )
    plan = planner.plan(model, get_default_sharders())
    assert asked == ["load"]
    assert sharding_type_counts(table_shardings(plan)) == {"data_parallel": 100}


def path_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    with local_process_group(rank, world, port):
        spec, model = tiny_model()
        planner = DreamShardPlanner(
            topology=torchrec_topology(world, "cpu"),
            batch_size=512,
            constraints=spec.planner_constraints(),
        )
        plan = planner.collective_plan(model, get_default_sharders(), dist.GroupMember.WORLD)
        profile = planner.profile
        path = None if profile is None or profile.sharding_path is None else profile.sharding_path
        result = {
            "types": sharding_type_counts(table_shardings(plan)),
            "path": None if path is None else path.to_dict(),
            "spent": planner.adaptation.get("spent_s"),
        }
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
    exit_spawned_rank()


@pytest.mark.slow
def test_under_collective_plan_the_path_is_timed_on_the_jobs_own_group(tmp_path, comm_model):
    mp.spawn(path_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["types"] == ranks[1]["types"]  # (the fixture's dense kernel decides them)
    path = ShardingPathModel.from_dict(ranks[0]["path"])
    assert "2 gloo ranks of the job" in path.source, path.source
    assert path.timings.world_size == 2 and path.timings.meta["ranks"] == "gloo"
    assert ranks[0]["spent"]["sharding_path"] > 0  # timed there, no process started
