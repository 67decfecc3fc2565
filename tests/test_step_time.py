"""The end-to-end step timer (``evaluation.dmp_step``), its statistics (``evaluation.step_stats``)
and ``dreamshard steptime``'s planners."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from torchrec_dreamshard.cli.steptime import NamedPlanner, report_lines, table_wise_only
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.evaluation.dmp_step import (
    StepTimerConfig,
    StepTimerError,
    check_plan,
    make_plan,
    table_shardings,
    time_plans,
)
from torchrec_dreamshard.evaluation.step_model import StepModelSpec
from torchrec_dreamshard.evaluation.step_stats import (
    median_coverage,
    median_interval,
    ratio_interval,
    verdict,
)
from torchrec_dreamshard.measure import balanced_order


def tiny_spec() -> StepModelSpec:
    bags = [TableSpec(name=f"b{i}", rows=50 * (i + 1), dim=8, pooling_factor=2.0) for i in range(3)]
    seqs = [TableSpec(name="s0", rows=300, dim=8, pooling_factor=3.0)]
    return StepModelSpec(bags=bags, sequences=seqs)


# -- statistics ------------------------------------------------------------------------


def test_median_interval_uses_the_order_statistics_with_binomial_coverage():
    assert median_coverage(10, 2) == pytest.approx(1 - 2 * 11 / 1024)
    values = [7.0, 3.0, 10.0, 1.0, 5.0, 9.0, 2.0, 8.0, 6.0, 4.0]
    iv = median_interval(values)
    assert (iv.median, iv.low, iv.high, iv.n) == (5.5, 2.0, 9.0, 10)
    assert iv.coverage == pytest.approx(0.978515625)
    small = median_interval([3.0, 1.0, 2.0])  # no 95% interval exists: [min, max] at 75%
    assert (small.low, small.high, small.coverage) == (1.0, 3.0, 0.75)
    with pytest.raises(ValueError, match="finite"):
        median_interval([1.0, math.nan])


def test_ratio_interval_covers_the_true_ratio_as_often_as_it_says():
    rng = np.random.default_rng(0)
    true_ratio, trials, hits = 0.95, 2000, 0
    for _ in range(trials):
        b = 50.0 * np.exp(rng.normal(0, 0.04, 10))  # 4% noise, a shared drift per round
        a = b * true_ratio * np.exp(rng.normal(0, 0.04, 10))
        iv = ratio_interval(a, b)
        hits += iv.low <= true_ratio <= iv.high
    assert abs(hits / trials - median_coverage(10, 2)) < 0.015


def test_verdict_calls_a_difference_only_beyond_the_interval():
    faster = ratio_interval([90.0] * 10, [100.0] * 10)
    assert (faster.median, faster.low, faster.high) == pytest.approx((0.9, 0.9, 0.9))
    assert verdict(faster, "A", "B") == "A faster than B by 10.0%"
    slower = ratio_interval([105, 106, 104, 107, 105, 106, 104, 105, 108, 103], [100] * 10)
    assert verdict(slower, "A", "B").startswith("A slower than B by 5")
    mixed = ratio_interval([98, 103, 99, 101, 97, 104, 100, 102, 96, 105], [100] * 10)
    assert verdict(mixed, "A", "B") == "no difference beyond the interval"
    assert verdict(ratio_interval([50, 50], [100, 100]), "A", "B").startswith("too few rounds")


# -- the model spec and planners ----------------------------------------------------------


def test_model_spec_refuses_what_torchrec_cannot_build():
    t = TableSpec(name="a", rows=10, dim=8, pooling_factor=1.0)
    with pytest.raises(ValueError, match="at least one"):
        StepModelSpec()
    with pytest.raises(ValueError, match="unique"):
        StepModelSpec(bags=[t], sequences=[t])
    other = TableSpec(name="b", rows=10, dim=16, pooling_factor=1.0)
    c = TableSpec(name="c", rows=10, dim=8, pooling_factor=1.0)
    with pytest.raises(ValueError, match="one dim"):
        StepModelSpec(sequences=[other, c])
    with pytest.raises(ValueError, match="unknown fields"):
        StepModelSpec.from_dict({"tables": [t.to_dict()], "sequences": []})
    spec = StepModelSpec.from_dict({"tables": [t.to_dict()], "batch_size": 4, "num_devices": 2})
    assert spec.bags == (t,) and spec.planner_constraints()["a"].pooling_factors == [1.0]


def test_a_spec_is_built_from_torchrec_configs_and_constraints():
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig

    from torchrec_dreamshard.evaluation.step_model import spec_from_configs

    bag = EmbeddingBagConfig(name="u", embedding_dim=16, num_embeddings=1000, feature_names=["x"])
    seq = EmbeddingConfig(name="h", embedding_dim=8, num_embeddings=500, feature_names=["y"])
    constraints = {"u": ParameterConstraints(pooling_factors=[3.0], sharding_types=["row_wise"])}
    spec = spec_from_configs([bag], [seq], constraints)
    assert [(t.name, t.rows, t.dim, t.pooling_factor) for t in spec.tables] == [
        ("u", 1000, 16, 3.0),
        ("h", 500, 8, 1.0),
    ]
    assert spec.planner_constraints()["u"].sharding_types == ["row_wise"]


def test_table_wise_only_keeps_the_other_constraints():
    from torchrec.distributed.planner.types import ParameterConstraints

    c = {"a": ParameterConstraints(pooling_factors=[3.0], sharding_types=["row_wise"])}
    tw = table_wise_only(c)["a"]
    assert tw.sharding_types == ["table_wise"] and tw.pooling_factors == [3.0]
    assert c["a"].sharding_types == ["row_wise"]  # the caller's constraints are untouched
    with pytest.raises(ValueError, match="unknown planner"):
        NamedPlanner("greedy")


def test_a_plan_is_checked_against_the_model_and_the_world():
    spec = tiny_spec()
    plan = make_plan(spec, NamedPlanner("torchrec-tw"), 2, 8)
    assert set(table_shardings(plan)) == {"b0", "b1", "b2", "s0"}
    plan.plan["sparse"]["b1"].ranks = [5]
    with pytest.raises(ValueError, match=r"table 'b1' is on ranks \[5\], outside 0..1"):
        check_plan(spec, plan, 2)
    del plan.plan["sparse"]["b1"]
    with pytest.raises(ValueError, match=r"leaves out tables \['b1'\]"):
        check_plan(spec, plan, 2)
    with pytest.raises(ValueError, match="ShardingPlan or a planner factory"):
        make_plan(spec, "torchrec", 2, 8)


# -- spawned ranks -----------------------------------------------------------------------


def failing_planner(topology, batch_size, constraints):
    raise ValueError("this planner has no plan for you")


@pytest.mark.slow
def test_two_plans_are_timed_in_alternating_rounds_on_two_ranks(tmp_path):
    log = tmp_path / "rounds.jsonl"
    plans = {"torchrec": NamedPlanner("torchrec"), "tw": NamedPlanner("torchrec-tw")}
    config = StepTimerConfig(batch_size=16, rounds=2, warmup_steps=1, steps=2, timeout_s=240)
    times = time_plans(tiny_spec(), plans, world_size=2, config=config, round_log=log)
    assert [r["order"] for r in times.rounds] == [["torchrec", "tw"], ["tw", "torchrec"]]
    for name in plans:
        assert len(times.step_ms(name)) == 2
        assert all(math.isfinite(ms) and ms > 0 for ms in times.step_ms(name))
        assert times.plans[name]["pipelined"] == 2  # both collections' input dist overlapped
        assert set(times.plans[name]["tables"]) == {"b0", "b1", "b2", "s0"}
    assert {t["sharding_type"] for t in times.plans["tw"]["tables"].values()} == {"table_wise"}
    assert [json.loads(line) for line in log.read_text().splitlines()] == times.rounds
    lines = report_lines(times.to_dict(), "torchrec")
    assert any(line.startswith("tw / torchrec: too few rounds") for line in lines)


@pytest.mark.slow
@pytest.mark.usefixtures("comm_model")  # fixed machine models for the spawned planner
def test_dreamshard_plans_bags_and_sequences_that_train_under_dmp_on_two_ranks():
    """A model with an EmbeddingBagCollection and an EmbeddingCollection: DreamShardPlanner
    plans both (the sequence table rated as a sequence lookup) and the plan trains."""
    plans = {"dreamshard": NamedPlanner("dreamshard")}
    config = StepTimerConfig(batch_size=16, rounds=1, warmup_steps=1, steps=2, timeout_s=240)
    times = time_plans(tiny_spec(), plans, world_size=2, config=config)
    tables = times.plans["dreamshard"]["tables"]
    assert set(tables) == {"b0", "b1", "b2", "s0"}
    assert all(math.isfinite(ms) and ms > 0 for ms in times.step_ms("dreamshard"))
    assert times.plans["dreamshard"]["pipelined"] == 2


@pytest.mark.slow
def test_a_failing_plan_raises_on_the_caller_without_hanging():
    plans = {"ok": NamedPlanner("torchrec-tw"), "bad": failing_planner}
    config = StepTimerConfig(batch_size=8, rounds=1, warmup_steps=0, steps=1, timeout_s=120)
    # the plan's own error, not the timer's timeout: nothing waited for the failed rank
    with pytest.raises(StepTimerError, match=r"plan 'bad' \(on rank 0\): ValueError") as err:
        time_plans(tiny_spec(), plans, world_size=2, config=config)
    assert "this planner has no plan for you" in str(err.value)


def test_steptime_command_prints_the_comparison_and_writes_the_rounds(
    tmp_path, capsys, monkeypatch
):
    from torchrec_dreamshard.cli import main
    from torchrec_dreamshard.evaluation import dmp_step

    tables = {"a": {"sharding_type": "table_wise", "compute_kernel": "fused", "ranks": [0]}}
    seen = {}

    def fake_time_plans(spec, plans, world_size, config, round_log):
        seen.update(spec=spec, plans=plans, world=world_size, config=config)
        rounds = [
            {"round": r, "order": [list(plans)[i] for i in balanced_order(len(plans), r)],
             "step_ms": {"torchrec": 100.0 + r, "dreamshard": 90.0 + r}}
            for r in range(config.rounds)
        ]  # fmt: skip
        info = {"tables": tables, "pipelined": 1}
        return dmp_step.StepTimes(world_size=world_size, config={}, rounds=rounds,
                                  plans={n: info for n in plans})  # fmt: skip

    monkeypatch.setattr(dmp_step, "time_plans", fake_time_plans)
    from torchrec_dreamshard.cli import steptime

    monkeypatch.setattr(steptime, "prepare_machine_models", lambda: None)  # no gloo fit here
    monkeypatch.delenv("RANK", raising=False)
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"tables": [{"name": "a", "rows": 10, "dim": 4,
                                             "pooling_factor": 1.0}]}))  # fmt: skip
    out = tmp_path / "times.json"
    argv = ["steptime", str(model), "--planners", "torchrec,dreamshard", "--rounds", "10"]
    assert main(argv + ["--steps", "4", "--world-size", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "10 rounds on 2 ranks" in printed and "97.9%" in printed
    assert "dreamshard / torchrec: dreamshard faster than torchrec by" in printed
    assert "table_wise 1" in printed
    assert len(json.loads(out.read_text())["rounds"]) == 10
    assert seen["config"].steps == 4 and seen["world"] == 2
    assert [p.kind for p in seen["plans"].values()] == ["torchrec", "dreamshard"]
    assert main(["steptime", str(model), "--planners", "torchrec,torchrec"]) == 2
    assert "distinct planners" in capsys.readouterr().err
