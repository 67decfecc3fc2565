"""The generalisation benchmark's methods (``evaluation.method_roster``): every method
plans each task, and the calibrated ones go through the planner's own path
(``calibration.plan_task``)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.evaluation import method_roster, plan_measuring
from torchrec_dreamshard.measure import MeasureConfig


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
    monkeypatch.setattr(plan_measuring, "single_ms", lambda spec, b, c: float(spec.dim))
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
