"""The generalisation report's section on the default planner: its geomean over tasks is
weighted by each family's task count, and held-out families are reported apart."""

from __future__ import annotations

import math

from torchrec_dreamshard.evaluation.family_report import default_report


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
