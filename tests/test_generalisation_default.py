"""The generalisation report's section on the default planner: its geomean over tasks is
weighted by each family's task count, and held-out families are reported apart."""

from __future__ import annotations

import math

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task

from harness.family_report import default_report


def family(ratio: float, tasks: int, heldout: bool) -> dict:
    out = {"tasks": tasks, "heldout": heldout}
    for key in ("compute/default", "compute/default_unverified", "step/default"):
        out[key], out[f"{key}/worst"] = ratio, ratio
    return out


def test_the_default_section_reports_the_geomean_over_tasks_and_held_out_apart():
    fams = {"pool": family(0.8, 3, False), "wide": family(1.25, 1, True)}
    text = "\n".join(default_report(fams, ["size_greedy", "default", "default_unverified"]))
    expected = math.exp((3 * math.log(0.8) + math.log(1.25)) / 4)
    assert f"over every task: {expected:.3f}" in text
    assert "held-out families 1.250, the others 0.800" in text
    assert "| wide | yes | 1.250 [1.25]" in text


def test_no_default_section_without_the_default_method():
    assert default_report({"pool": family(0.8, 1, False)}, ["size_greedy"]) == []


def test_a_family_without_a_default_plan_is_left_out_of_the_geomean():
    fams = {"pool": family(0.9, 2, False), "tall": family(float("nan"), 1, True)}
    text = "\n".join(default_report(fams, ["default"]))
    assert "over every task: 0.900" in text and "held-out families nan" in text


def test_each_default_plan_is_set_against_the_budget_it_planned_within():
    """Per family the mean and longest plan seconds; over the run the longest plan and
    how many went over the budget (a raw entry without its budget: the planner's)."""
    from torchrec_dreamshard.planner.steps.profile_step import FIRST_PLAN_BUDGET_S

    from harness.family_statistics import default_seconds

    pool = default_seconds(
        [
            {"planning_s": {"default": 10.0, "default_budget_s": 25.0}},
            {"planning_s": {"default": 30.0, "default_budget_s": 25.0}},
        ]
    )
    assert pool == {
        "seconds/default": 20.0,
        "seconds/default/max": 30.0,
        "seconds/default/over_budget": 1,
        "default_budget_s": 25.0,
    }
    wide = default_seconds([{"planning_s": {"default": 12.0}}])
    assert wide["default_budget_s"] == FIRST_PLAN_BUDGET_S
    assert wide["seconds/default/over_budget"] == int(12.0 > FIRST_PLAN_BUDGET_S)
    assert default_seconds([{"planning_s": {"torchrec": 0.1}}]) == {}
    fams = {"pool": family(0.8, 2, False) | pool, "wide": family(1.0, 1, True) | wide}
    text = "\n".join(default_report(fams, ["default"]))
    assert "| pool |  | 0.800 [0.80] | 0.800 [0.80] | 0.800 [0.80] | 20.0 [30.0] |" in text
    assert "the longest took 30.0 s (pool); 1 of 3 tasks took longer than the budget" in text


def test_a_family_without_a_default_plan_says_so():
    fams = {"tall": family(float("nan"), 1, True) | {"compute/default/no_plan": 1}}
    text = "\n".join(default_report(fams, ["default"]))
    assert "nan [nan] (1 no plan) |" in text
    assert "The run holds no default plan seconds." in text


def default_vs_torchrec():
    """``benchmarks/default_vs_torchrec.py`` as a module."""
    import sys
    from pathlib import Path

    benchmarks = str(Path(__file__).resolve().parents[1] / "benchmarks")
    sys.path.insert(0, benchmarks)
    try:
        import default_vs_torchrec as module
    finally:
        sys.path.remove(benchmarks)
    return module


def raw_task(family_name: str, secs: dict, default: list[int] | None) -> dict:
    """A raw entry of a generalisation run: the default's plan (or none), TorchRec's and
    a heuristic's, measured in one round."""
    plans = {"default": default, "torchrec": [0, 1], "size_greedy": [1, 0]}
    costs = {"[0, 1]": {"compute": 2.0}, "[1, 0]": {"compute": 4.0}}
    return {"family": family_name, "plans": plans, "secs": secs, "rounds": [costs]}


def two_tables(memory: list[int]) -> Task:
    """Two tables of 64,000 bytes of weights (TorchRec's estimate: 68,608) on 2 devices."""
    tables = [TableSpec(name=f"t{i}", rows=1000, dim=16, pooling_factor=1.0) for i in range(2)]
    return Task(tables=tables, num_devices=2, memory_bytes=memory, batch_size=64)


def test_default_vs_torchrec_reports_each_plans_seconds_and_what_it_kept():
    module = default_vs_torchrec()
    verified = {"margins": {"line": "verified 5 plans in 1.4 s (3 rounds): kept TorchRec's"}}
    roomy = two_tables([10**7, 10**7])
    rows = [
        module.task_row(
            raw_task("pool", {"default": 7.5, "default_adaptation": verified}, [1, 0]),
            "compute",
            roomy,
        ),
        module.task_row(
            raw_task(
                "tight",
                {"default": 31.0, "default_budget_s": 25.0, "default_error": "found no plan: x"},
                None,
            ),
            "compute",
            roomy,
        ),
    ]
    assert rows[0]["vs_torchrec"] == 2.0 and rows[0]["within_budget"] is True
    assert rows[0]["kept"].startswith("verified 5 plans")
    assert rows[1]["vs_torchrec"] is None and rows[1]["within_budget"] is False
    assert rows[1]["kept"] == "no plan: found no plan: x"
    text = module.summary("run", rows, "compute")
    assert "| pool |  | 1.000 | 1.000 | 2.000 [2.000, 2.000] | 1 | 7.5 |" in text
    assert "the longest took 31.0 s (tight); over the budget: tight (31.0 s) (1 of 2" in text


def test_default_vs_torchrec_leaves_out_heuristics_over_torchrecs_storage_estimate():
    """A heuristic's plan that puts more than a device holds by TorchRec's estimate (its
    weights fit) is no comparison for the default, which TorchRec's estimate binds."""
    module = default_vs_torchrec()
    row = module.task_row(
        raw_task("zipf", {"default": 5.0}, [0, 1]), "compute", two_tables([64_100, 140_000])
    )
    assert row["vs_best_heuristic"] == 0.5  # size_greedy's [1, 0] measured 4.0 against 2.0
    assert row["vs_best_fitting_heuristic"] is None  # device 0 holds 64,100 < 68,608
