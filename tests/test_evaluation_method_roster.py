"""The generalisation benchmark's methods (``harness.method_roster``): every method
plans each task, and the calibrated ones go through the planner's own path
(``calibration.plan_task``)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.evaluation import placers
from torchrec_dreamshard.measure import MeasureConfig

from harness import method_roster


def small_task() -> Task:
    tables = [
        TableSpec(name=f"t{i}", rows=500 * (i + 1), dim=8 * (1 + i % 2), pooling_factor=1.0 + i)
        for i in range(6)
    ]
    return Task(tables=tables, num_devices=2, memory_bytes=10**7, batch_size=64)


def test_methods_add_the_calibrated_ones_per_budget():
    assert method_roster.methods() == list(method_roster.METHODS)
    assert method_roster.methods([30, 60], 4, default=True)[len(method_roster.METHODS) :] == [
        "calibrated_30",
        "calibrated_30_verify4",
        "calibrated_60",
        "calibrated_60_verify4",
        "default",
        "default_unverified",
    ]


def test_every_method_plans_the_task(agent, monkeypatch):
    monkeypatch.setattr(placers, "single_ms", lambda spec, b, c: float(spec.dim))
    plans, secs = method_roster.plan_every_method(agent, small_task(), MeasureConfig(), 7)
    assert list(plans) == [*method_roster.METHODS, *method_roster.RANDOM]
    assert all(plans[n] is not None for n in plans if n != "torchrec")
    assert secs["safe_report"]["winner"]  # the safe mode's safety-net report is kept


def test_calibrated_methods_plan_through_plan_task(agent, monkeypatch, tmp_path):
    """Each budget is one ``plan_task`` call: the calibrated model's choice is
    ``calibrated_B``, the verification's winner ``calibrated_B_verifyK``."""
    from torchrec_dreamshard import calibration

    monkeypatch.setenv(calibration.STORE_ENV, str(tmp_path / "calibration.sqlite"))
    calls = []

    def fake_plan_task(prior, task, **kwargs):
        calls.append(kwargs)
        budget = kwargs["calibration"].budget_s
        return SimpleNamespace(
            chosen=[0] * len(task.tables),
            placement=[1] * len(task.tables),
            calibration=SimpleNamespace(seconds=budget / 10, samples=3),
            verification=SimpleNamespace(seconds=2.0) if kwargs["verification"].k else None,
        )

    monkeypatch.setattr(calibration, "plan_task", fake_plan_task)
    run = argparse.Namespace(calibrate_budget=[20.0, 40.0], verify=2, name="roster_test")
    config = MeasureConfig(rounds=1)
    plans, secs = {}, {}
    method_roster.plan_calibrated(agent, small_task(), config, run, 5, plans, secs)
    assert [(c["calibration"].budget_s, c["verification"].k, c["how"].seed) for c in calls] == [
        (20.0, 2, 5),
        (40.0, 2, 5),
    ]
    assert all(c["verification"].config is config and c["how"].mode == "safe" for c in calls)
    assert plans["calibrated_20"] == [0] * 6 and plans["calibrated_40_verify2"] == [1] * 6
    assert secs["calibrated_40_calibrate"] == 4.0 and secs["calibrated_20_kernels"] == 3
    assert secs["calibrated_20_verify2"] == 2.0


class RecordingPlanner:
    """Wraps ``DreamShardPlanner`` so a test sees the planner ``plan_default`` built, its
    arguments and what its cache held when it was built."""

    made: list = []

    def __new__(cls, *args, **kwargs):
        from torchrec_dreamshard.planner import planners

        planner = planners.DreamShardPlanner(*args, **kwargs)
        cache = kwargs["cache_dir"]
        cls.made.append((planner, kwargs, cache, sorted(cache.iterdir())))
        return planner


@pytest.fixture
def measured_machine(monkeypatch):
    """The machine measured as a user's first plan measures it (the test session pins
    the planner's reference kernel, collectives and dense kernel: conftest)."""
    from torchrec_dreamshard.cache import reference_time
    from torchrec_dreamshard.cost import collective_models, dense_kernel_model
    from torchrec_dreamshard.planner.steps import machine_sources

    monkeypatch.setattr(machine_sources, "load_reference_ms", reference_time.load_reference_ms)
    monkeypatch.setattr(
        machine_sources, "load_collective_models", collective_models.load_collective_models
    )
    monkeypatch.setattr(
        machine_sources, "load_dense_kernel_model", dense_kernel_model.load_dense_kernel_model
    )


@pytest.mark.slow  # it measures this machine (about 6 s on two idle cores)
def test_default_is_a_first_plan_of_the_planner_with_no_flags(
    measured_machine, monkeypatch, tmp_path
):
    """The real default: ``DreamShardPlanner`` with the bundled checkpoint, measuring this
    machine within its own budget from an empty cache of its own, deleted after; whole
    tables, nothing more reserved of the task's memory; nothing written to the user's
    cache."""
    import json

    from torchrec.distributed.planner.storage_reservations import (
        FixedPercentageStorageReservation,
    )

    from torchrec_dreamshard import planner as planner_package
    from torchrec_dreamshard.calibration import STORE_ENV
    from torchrec_dreamshard.planner.adapters.task_inputs import task_model
    from torchrec_dreamshard.planner.steps.profile_step import FIRST_PLAN_BUDGET_S
    from torchrec_dreamshard.policy.checkpoint import load_checkpoint

    home = tmp_path / "home"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    monkeypatch.setenv(STORE_ENV, str(home / "store.sqlite"))
    monkeypatch.setattr(RecordingPlanner, "made", [])
    monkeypatch.setattr(planner_package, "DreamShardPlanner", RecordingPlanner)
    task = small_task()
    plans, secs = {}, {}
    method_roster.plan_default(load_checkpoint(None), task, plans, secs)

    [(planner, kwargs, cache, held)] = RecordingPlanner.made
    assert held == [] and not cache.exists()  # an empty cache of its own, gone after
    assert kwargs["timeout_seconds"] is None and kwargs["measure"] is True
    reservation = kwargs["storage_reservation"]
    assert isinstance(reservation, FixedPercentageStorageReservation)
    left = reservation.reserve(kwargs["topology"], 32, task_model(task), [])
    assert [d.storage.ddr for d in left.devices] == [task.memory[0]] * 2  # nothing reserved
    assert {tuple(c.sharding_types) for c in kwargs["constraints"].values()} == {("table_wise",)}
    assert plans["default"] == [planner.last_placement[f".{t.name}"] for t in task.tables]
    assert len(plans["default_unverified"]) == 6
    assert all(d in (0, 1) for d in plans["default"] + plans["default_unverified"])
    adaptation = secs["default_adaptation"]
    assert json.loads(json.dumps(adaptation)) == adaptation  # raw files hold it as JSON
    assert adaptation["profile"]["stamp"]["world_size"] == 2 and "spent_s" in adaptation
    assert secs["default"] > 0 and secs["default_budget_s"] == FIRST_PLAN_BUDGET_S
    assert adaptation["spent_s"]["reference_kernel"] > 0  # it measured this machine
    if not adaptation["verified"]:  # nothing verified: the policy's choice is the plan
        assert plans["default_unverified"] == plans["default"]
    assert not home.exists()  # nothing in the user's cache


def test_default_without_a_plan_records_why():
    """Tables whose weights fit the devices (528,000 bytes on 2 x 275,000) but not with
    TorchRec's storage estimate (optimizer state, input and output buffers): no plan
    (``None``, as other placers record it), with the planner's reason and its seconds."""
    import dataclasses

    from torchrec_dreamshard.policy.checkpoint import load_checkpoint

    task = dataclasses.replace(small_task(), memory_bytes=275_000)
    plans, secs = {}, {}
    method_roster.plan_default(load_checkpoint(None), task, plans, secs)
    assert plans == {"default": None, "default_unverified": None}
    assert "DreamShardPlanner found no plan" in secs["default_error"]
    assert "insufficient storage" in secs["default_error"]
    assert secs["default"] > 0 and "default_adaptation" not in secs


def test_the_unverified_plan_is_the_verifications_chosen_by_table(agent):
    """The policy's choice before the verification, mapped from the policy's task (its
    tables by fully qualified name, in its own order) to the task's order."""
    import dataclasses
    from types import SimpleNamespace

    from torchrec_dreamshard.calibration.planning import PlanOutcome
    from torchrec_dreamshard.planner.steps.verify_step import LoopChoice, Verdict

    from harness.default_planning import unverified

    task = small_task()
    placement = [0] * 6
    planner = SimpleNamespace(last_verdict=None)
    assert unverified(planner, task, placement) == placement  # nothing verified

    def verified(tables, chosen):
        verified_task = dataclasses.replace(task, tables=tables)
        fqns = tuple(t.name for t in tables)
        choice = LoopChoice(verified_task, tuple(chosen), fqns)
        outcome = PlanOutcome(placement, agent, chosen=chosen)
        return SimpleNamespace(last_verdict=Verdict(outcome, choice=choice))

    renamed = [dataclasses.replace(t, name=f".{t.name}") for t in reversed(task.tables)]
    chosen = [1, 0, 1, 1, 0, 0]  # t5, t4, ..., t0
    assert unverified(verified(renamed, chosen), task, placement) == chosen[::-1]
    planner = verified(renamed[:-1], chosen[:-1])
    with pytest.raises(ValueError, match="t0"):
        unverified(planner, task, placement)
