"""The planner measures in two steps only (the machine profile before TorchRec's loop, the
verification after it), within one budget; ``measure=False`` and a given profile measure
nothing and write nothing; the same profile gives the same plan."""

from __future__ import annotations

import ast
import itertools
import math
import pickle
from pathlib import Path

import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed.sharding_plan import get_default_sharders

import torchrec_dreamshard
from torchrec_dreamshard import DreamShardPlanner
from torchrec_dreamshard.calibration import CalibrationConfig
from torchrec_dreamshard.measure.gate import MeasuringForbidden, check_may_measure, no_measuring
from torchrec_dreamshard.planner.adapters.topology import torchrec_topology
from torchrec_dreamshard.profile import budget as budget_module
from torchrec_dreamshard.profile.budget import Budget
from torchrec_dreamshard.profile.machine_profile import MachineProfile

META = torch.device("meta")
PACKAGE = Path(torchrec_dreamshard.__file__).parent


def model(n: int = 8) -> EmbeddingBagCollection:
    tables = [
        EmbeddingBagConfig(
            name=f"t{i}",
            embedding_dim=16 * (1 + i % 3),
            num_embeddings=500 * (1 + i),
            feature_names=[f"f{i}"],
        )
        for i in range(n)
    ]
    return EmbeddingBagCollection(tables=tables, device=META)


def files_under(root: Path) -> dict[str, bytes]:
    if not root.exists():
        return {}
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def plan_bytes(plan) -> bytes:
    return pickle.dumps(sorted(plan.plan["" if "" in plan.plan else next(iter(plan.plan))].items()))


def test_the_gate_refuses_timing_inside_and_allows_it_outside():
    check_may_measure("outside")  # open
    with no_measuring("a test"), pytest.raises(MeasuringForbidden, match="a test"):
        check_may_measure("inside")
    check_may_measure("after")


def test_measure_false_times_nothing_and_writes_nothing(cold_cache):
    with no_measuring("measure=False must time nothing"):
        planner = DreamShardPlanner(
            topology=torchrec_topology(4, "cpu"), batch_size=64, measure=False
        )
        plan = planner.plan(model(), get_default_sharders())
    assert plan.plan
    assert files_under(cold_cache) == {}
    notes = planner.adaptation["measuring_notes"]
    assert any("measure=False" in n for n in notes)
    assert planner.profile is not None and planner.profile.reference_ms is None


def test_measure_must_be_a_bool():
    with pytest.raises(ValueError, match="measure must be True or False"):
        DreamShardPlanner(topology=torchrec_topology(2, "cpu"), measure="no")


@pytest.mark.parametrize("asked", [{}, {"calibrate": True, "verify": 2}])
def test_a_cuda_topology_without_cuda_times_nothing(cold_cache, asked):
    """Neither by default nor where calibration and verification are asked for: nothing is
    timed on this CPU as a stand-in for the GPUs, and the first line says so."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with no_measuring("a CUDA topology must not be timed on this CPU"):
        planner = DreamShardPlanner(topology=torchrec_topology(4, "cuda"), batch_size=64, **asked)
        planner.plan(model(), get_default_sharders())
    notes = " ".join(planner.adaptation["measuring_notes"])
    assert "without CUDA" in notes and "nothing is timed" in notes
    assert "without CUDA" in planner.adaptation["why"]  # the first line of the stats
    assert not planner.adaptation["calibrated"] and not planner.adaptation["verified"]
    assert files_under(cold_cache) == {}


@pytest.mark.slow
def test_a_saved_profile_plans_with_nothing_timed_and_the_same_plan_each_time(cold_cache, tmp_path):
    topology = torchrec_topology(4, "cpu")
    # the drift check off: on a loaded machine it may discard every kernel, which is not
    # what this test is about
    calibration = CalibrationConfig(budget_s=8.0, drift_limit=math.inf, progress=False)
    first = DreamShardPlanner(topology=topology, batch_size=64, calibrate=calibration, verify=0)
    first.plan(model(), get_default_sharders())
    assert first.profile is not None and first.profile.calibrated
    # the calibrated kernels' error, which the type choice's margin takes for them
    mape = first.agent.meta["calibrated"]["kernel_mape"]
    assert math.isfinite(mape) and mape == first.adaptation["kernel_mape_after"]
    path = tmp_path / "machine.profile"
    first.profile.save(path)
    loaded = MachineProfile.load(path)
    assert loaded.summary() == first.profile.summary()
    before = files_under(cold_cache)
    plans = []
    with no_measuring("a given profile must time nothing"):
        for _ in range(3):
            planner = DreamShardPlanner(topology=topology, batch_size=64, profile=path)
            plans.append(pickle.dumps(planner.plan(model(), get_default_sharders()).plan))
    assert files_under(cold_cache) == before  # nothing written
    assert plans[0] == plans[1] == plans[2]
    assert planner.adaptation["calibrated"]  # the profile's calibrated network
    assert planner.agent.meta["calibrated"]["kernel_mape"] == mape


def test_a_profile_file_that_is_not_one_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.profile"
    bad.write_bytes(b"not a profile")
    with pytest.raises(ValueError, match="could not be read safely"):
        DreamShardPlanner(topology=torchrec_topology(2, "cpu"), profile=bad)
    with pytest.raises(ValueError, match="does not exist"):
        DreamShardPlanner(topology=torchrec_topology(2, "cpu"), profile=tmp_path / "none")


class SteppingClock:
    """A clock that moves ``step`` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self._ticks = itertools.count()
        self.step = step

    def __call__(self) -> float:
        return next(self._ticks) * self.step


def test_a_spent_budget_skips_calibration_and_verification_and_says_so(comm_model, monkeypatch):
    # every reading of the plan's clock moves 4 s: after the machine's models, less than
    # the 6 s calibration needs is left of a 10 s budget
    monkeypatch.setattr(budget_module, "CLOCK", SteppingClock(4.0))
    with no_measuring("the budget was spent: nothing but the cached models may be read"):
        planner = DreamShardPlanner(
            topology=torchrec_topology(4, "cpu"),
            batch_size=64,
            timeout_seconds=10,
            calibrate=30.0,
            verify=2,
        )
        planner.plan(model(), get_default_sharders())
    notes = " ".join(planner.adaptation["measuring_notes"])
    assert "calibration skipped" in notes and "verification skipped" in notes
    assert not planner.adaptation["calibrated"]


def test_budget_counts_on_the_clock_it_is_given():
    clock = SteppingClock(1.0)
    budget = Budget(5.0, clock=clock)  # start at 0
    assert budget.remaining() == 4.0  # read at 1
    assert budget.share(0.5, cap=10.0) == 1.5  # read at 2: 3 left
    assert Budget(None, clock=clock).remaining() == float("inf")
    with pytest.raises(ValueError, match="budget must be > 0"):
        Budget(0, clock=clock)


# -- only the two measuring steps measure ----------------------------------------------

TIMERS = {"perf_counter", "monotonic", "time", "perf_counter_ns", "monotonic_ns"}
MEASURING_ENTRY_POINTS = {
    "measure_reference_ms",
    "load_reference_ms",
    "load_collective_models",
    "load_group_collectives",
    "load_dense_kernel_model",
    "calibrate",
    "verify",
    "verify_chosen",
    "measure_placement",
    "time_fused_kernel",
}
# the planner's modules allowed to name a measuring entry point: the two steps, and the
# defaults that tell the profile step where to measure from
MEASURING_MODULES = {
    "profile_step.py",
    "verify_step.py",
    "measuring_steps.py",
    "defaults.py",
    "machine_sources.py",
}
QUIET_FOLDERS = ("planner", "policy", "cost", "data")


def _calls_and_imports(path: Path) -> tuple[set[str], set[str]]:
    tree = ast.parse(path.read_text())
    timers, names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in TIMERS:
            if isinstance(node.value, ast.Name) and node.value.id == "time":
                timers.add(f"time.{node.attr}")
        if isinstance(node, ast.ImportFrom) and node.module == "time":
            timers |= {a.name for a in node.names if a.name in TIMERS}
        if isinstance(node, ast.ImportFrom):
            names |= {a.name for a in node.names if a.name in MEASURING_ENTRY_POINTS}
    return timers, names


def test_no_module_of_the_planning_loop_calls_a_timer():
    offenders = {}
    for folder in QUIET_FOLDERS:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            timers, _ = _calls_and_imports(path)
            if timers:
                offenders[str(path.relative_to(PACKAGE))] = sorted(timers)
    assert offenders == {}, f"only the measuring steps time anything: {offenders}"


def test_only_the_measuring_steps_of_the_planner_name_a_measuring_entry_point():
    offenders = {}
    for path in sorted((PACKAGE / "planner").rglob("*.py")):
        _, names = _calls_and_imports(path)
        if names and path.name not in MEASURING_MODULES:
            offenders[path.name] = sorted(names)
    assert offenders == {}, f"measuring outside the two steps: {offenders}"


def test_the_scan_finds_a_timer(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import time\nfrom torchrec_dreamshard.x import calibrate\nt = time.perf_counter()\n"
    )
    assert _calls_and_imports(sample) == ({"time.perf_counter"}, {"calibrate"})


@pytest.mark.slow
def test_cache_dir_keeps_what_the_plan_measured_there_and_nowhere_else(cold_cache, tmp_path):
    cache = tmp_path / "planner_cache"
    calibration = CalibrationConfig(budget_s=6.0, drift_limit=math.inf, progress=False)
    planner = DreamShardPlanner(
        topology=torchrec_topology(2, "cpu"),
        batch_size=64,
        calibrate=calibration,
        verify=0,
        cache_dir=cache,
    )
    planner.plan(model(4), get_default_sharders())
    assert (cache / "calibration.sqlite").exists()
    assert files_under(cold_cache) == {}


def test_a_cache_dir_that_is_a_file_is_a_clear_error(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("")
    with pytest.raises(ValueError, match="a_file"):
        DreamShardPlanner(topology=torchrec_topology(2, "cpu"), cache_dir=path)


@pytest.mark.slow
def test_timeout_seconds_bounds_the_measuring_of_a_plan_that_would_take_longer(cold_cache):
    """A plan that asks for 60 s of calibration and a verification of 3 plans, given
    ``timeout_seconds=10``: what it measures (profile and verification) stays within the
    10 s, give or take the one batch of kernels a calibration always measures; the stats
    say what the budget cut."""
    calibration = CalibrationConfig(budget_s=60.0, drift_limit=math.inf, progress=False)
    planner = DreamShardPlanner(
        topology=torchrec_topology(4, "cpu"),
        batch_size=256,
        calibrate=calibration,
        verify=3,
        timeout_seconds=10,
    )
    planner.plan(model(40), get_default_sharders())
    spent = planner.adaptation["spent_s"]
    measuring = sum(s for what, s in spent.items() if what != "planning")
    assert measuring <= 10 * 1.3, spent
    assert planner.adaptation["measuring_notes"], planner.adaptation  # what was cut, said
