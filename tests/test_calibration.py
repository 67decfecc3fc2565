"""Calibration on the local machine and verification by measuring (fast: tiny tables,
one short timing round)."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path

import pytest
import torch

from torchrec_dreamshard import calibration as cal
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure import MeasureConfig
from torchrec_dreamshard.policy import DreamShard

FAST = MeasureConfig(rounds=1, iters=2, warmup=1)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch, comm_model):
    """A calibration store in ``tmp_path``, and a known all-to-all model (``comm_model``)."""
    monkeypatch.setenv(cal.STORE_ENV, str(tmp_path / "calibration.sqlite"))


def forbid_kernel_timing(monkeypatch) -> None:
    """From here on, timing any kernel fails the test: what is in the store is reused."""
    from torchrec_dreamshard.measure import local

    def timed(*args, **kwargs):
        raise AssertionError("a kernel was timed although the store holds it")

    monkeypatch.setattr(local, "time_groups", timed)


def tiny_task(num_tables: int = 5, num_devices: int = 2) -> Task:
    tables = [
        TableSpec(name=f"t{i}", rows=500 * (i + 1), dim=8 * (1 + i % 2), pooling_factor=1.0 + i)
        for i in range(num_tables)
    ]
    return Task(tables=tables, num_devices=num_devices, memory_bytes=10**7, batch_size=64)


def config(**kw) -> cal.CalibrationConfig:
    """Fast calibration settings, the reference-drift check off unless ``kw`` sets it (on
    a machine shared by other work it would discard what these tests measure)."""
    kw = {"drift_limit": math.inf, **kw}
    return cal.CalibrationConfig(measure=FAST, max_groups=3, progress=False, epochs=50, **kw)


def quiet(**kw) -> cal.VerifyOptions:
    """Verification settings with the noise checks off (no reference timed, no second
    pass, no fallback): the tests of the ranking and the budget see exactly their rounds."""
    return cal.VerifyOptions(noise=cal.NoiseLimits.off(), **kw)


def test_config_and_signatures():
    with pytest.raises(ValueError, match="budget_s must be > 0"):
        cal.CalibrationConfig(budget_s=0)
    with pytest.raises(ValueError, match="max_groups must be an integer"):
        cal.CalibrationConfig(max_groups=-1)
    a = TableSpec(name="a", rows=100, dim=8, pooling_factor=2.0)
    b = TableSpec(name="b", rows=100, dim=8, pooling_factor=2.0)
    c = TableSpec(name="c", rows=100, dim=16, pooling_factor=2.0)
    assert cal.table_signature(a) == cal.table_signature(b) != cal.table_signature(c)
    assert cal.kernel_job("p/", [a, c]) == cal.kernel_job("p/", [c, b])  # order- and name-free
    assert cal.kernel_job("p/", [a]).startswith("p/t-")


def test_informative_groups_are_distinct_multi_table_sets():
    agent = DreamShard.untrained(seed=0)
    groups = cal.informative_groups(agent, tiny_task(6, 2), max_groups=4)
    assert 1 <= len(groups) <= 4
    assert all(len(g) >= 2 for g in groups)
    assert len({tuple(g) for g in groups}) == len(groups)


def test_informative_groups_cover_the_plans_the_safe_mode_weighs():
    agent = DreamShard.untrained(seed=0)
    task = tiny_task(10, 3)
    groups = {tuple(g) for g in cal.informative_groups(agent, task, max_groups=10_000)}
    agent.place(task, mode="safe")
    for c in agent.last_report.candidates:
        for d in range(task.num_devices):
            tables = tuple(i for i, x in enumerate(c.placement) if x == d)
            assert len(tables) < 2 or tables in groups, (c.name, tables)


def test_calibrate_measures_fine_tunes_and_reuses_the_store(monkeypatch):
    agent = DreamShard.untrained(seed=0)
    prior = {n: p.detach().clone() for n, p in agent.cost_net.named_parameters()}
    task = tiny_task()
    first = cal.calibrate(agent, task, config())
    assert first.measured >= len(task.tables) and first.reused == 0 and first.skipped == 0
    assert first.samples == first.measured
    assert set(first.before) == set(first.after) == {"cost/mape", "cost/log_std"}
    # the prior is unchanged; the calibrated copy moved its heads only (and its all-to-all,
    # set from the machine's model: see the all-to-all test)
    tuned = dict(first.agent.cost_net.named_parameters())
    for n, p in agent.cost_net.named_parameters():
        assert torch.equal(p, prior[n]), n
        if n in (*cal.HEAD_PARAMETERS, "comm_raw"):
            continue
        assert torch.equal(tuned[n], p), f"{n} is not a head parameter but moved"
    assert not torch.equal(tuned["W_raw"], prior["W_raw"])
    assert first.agent.meta["calibrated"]["kernels"] == first.samples
    forbid_kernel_timing(monkeypatch)
    second = cal.calibrate(agent, task, config())
    assert second.measured == 0 and second.reused == first.measured
    assert second.after["cost/mape"] == pytest.approx(first.after["cost/mape"])


def test_calibration_fits_kernels_as_measured_whatever_their_reference_kernel_time(tmp_path):
    """The reference kernel timed beside a batch is noisier than the kernels: loading
    must not rescale the kernels by it."""
    import sqlite3

    from torchrec_dreamshard.store.cost_store import CostStore

    task = tiny_task()
    cal.calibrate(DreamShard.untrained(seed=0), task, config())
    path = cal.default_store_path()

    def samples():
        with CostStore(path) as store:
            jobs = {j for j in store.done_jobs(cal.job_prefix(store, FAST, task.batch_size))}
            out = cal.load_kernel_samples(store, jobs, FAST, task.batch_size)
        return {tuple(map(tuple, s.inputs.round(6))): s.dev_ms.copy() for s in out}

    before = samples()
    with sqlite3.connect(path) as con:  # one kernel's reference timed 3x slower
        con.execute("UPDATE measurements SET reference_ms = reference_ms * 3 WHERE id = 1")
    after = samples()
    assert len(before) == len(after) >= len(task.tables)
    for key, dev in before.items():
        assert after[key] == pytest.approx(dev), "a kernel was rescaled by its reference time"


def test_fine_tune_learns_a_faster_machine_from_few_kernels():
    """Kernels of a machine 40% faster than the prior believes: a few dozen of them bring
    the prior's error from 40% to a few percent, on kernels it did not see too."""
    import numpy as np

    from torchrec_dreamshard.cost.fitting import predict_samples, sample_from_measurement

    agent = DreamShard.untrained(seed=0)
    rng = np.random.default_rng(0)
    tables = [
        TableSpec(
            name=f"t{i}",
            rows=int(rng.integers(1_000, 200_000)),
            dim=int(rng.choice([8, 16, 32, 64])),
            pooling_factor=float(rng.uniform(1, 30)),
        )
        for i in range(40)
    ]
    kernels = [[t] for t in tables] + [
        list(rng.choice(tables, 3, replace=False)) for _ in range(20)
    ]
    samples = []
    for ks in kernels:
        x = sample_from_measurement("k", ks, [0] * len(ks), 1, 2048, [(1.0, 1.0, 0.0)])
        dev, _, _ = predict_samples(agent.cost_net, [x])
        fwd, bwd = 0.6 * dev[0, 0], 0.6 * dev[0, 1]
        samples.append(sample_from_measurement("k", ks, [0] * len(ks), 1, 2048, [(fwd, bwd, 0.0)]))
    train, test = samples[::2], samples[1::2]
    tuned = cal.fine_tune(agent.cost_net, train, epochs=300)
    assert cal.kernel_accuracy(agent.cost_net, test)["cost/mape"] > 60
    assert cal.kernel_accuracy(tuned, train)["cost/mape"] < 5
    assert cal.kernel_accuracy(tuned, test)["cost/mape"] < 5


def test_calibrate_keeps_to_the_budget_and_a_missing_store_folder_is_named(tmp_path):
    agent = DreamShard.untrained(seed=0)
    task = tiny_task(20, 2)
    res = cal.calibrate(agent, task, config(budget_s=0.01))  # below the fitting reserve
    assert res.measured == cal.KERNELS_PER_CALL  # the first batch always runs
    assert res.skipped == len(task.tables) + 3 - res.measured
    with pytest.raises(ValueError, match="folder does not exist"):
        cal.calibrate(agent, task, config(store=tmp_path / "nowhere" / "c.sqlite"))


def test_verify_measures_candidates_and_heuristics_and_ranks_them(monkeypatch):
    import statistics

    from torchrec_dreamshard.measure import placement_timing
    from torchrec_dreamshard.verification import plan_ranking

    agent = DreamShard.untrained(seed=0)
    task = tiny_task(6, 2)
    chosen = agent.place(task)
    calls, real = [], placement_timing.measure_placement

    def spy(t, placement, config=None, backend="local", comm=None, shared=None):
        m = real(t, placement, config, backend, comm, shared)
        calls.append((list(placement), float(m.step_ms)))
        return m

    monkeypatch.setattr(placement_timing, "measure_placement", spy)
    res = cal.verify(agent, task, 2, FAST, quiet(rounds=2), extra={"chosen": chosen})
    names = [p.name for p in res.plans]
    assert any("chosen" in n for n in names)
    assert any(p.heuristic and "greedy" in p.name for p in res.plans)  # the heuristics' plans
    assert all(p.predicted_ms > 0 for p in res.plans)
    # each round measured every plan once; a plan's rounds are the measurements of it
    n = len(res.plans)
    assert len(calls) == 2 * n
    for r in range(2):
        assert sorted(pl for pl, _ in calls[r * n : (r + 1) * n]) == sorted(
            p.placement for p in res.plans
        )
    for p in res.plans:
        assert p.rounds_ms == [ms for pl, ms in calls if pl == p.placement]
    # the ranking, recomputed from those measurements: the heuristic plan of lowest median
    # is kept unless plans beat it in both rounds and by the replacing margin at the median
    # (then the lowest median of those); the rest follow by median
    median = {p.name: statistics.median(p.rounds_ms) for p in res.plans}
    ref = min((p for p in res.plans if p.heuristic), key=lambda p: median[p.name])
    margin = 1.0 - plan_ranking.REPLACE_MARGIN
    faster = [
        p
        for p in res.plans
        if all(a < b for a, b in zip(p.rounds_ms, ref.rounds_ms, strict=True))
        and median[p.name] < margin * median[ref.name]
    ]
    winner = min(faster, key=lambda p: median[p.name]) if faster else ref
    rest = sorted((p.name for p in res.plans if p is not winner), key=median.get)
    assert [p.name for p in res.plans] == [winner.name, *rest]
    text = "\n".join(res.lines())
    assert "predicted ms" in text and "measured ms" in text and res.winner.name in text


def test_verification_measures_nothing_past_its_budget_and_the_chosen_plan_then_stands(clock):
    """Real kernels. A budget of 1 us on a clock that moves 1 s whenever it is read: out of
    time before the first measurement, whatever the machine's speed; then a budget that
    never runs out, on the machine's own clock: every round measured."""
    from torchrec_dreamshard.verification.verification import kernel_timing

    agent = DreamShard.untrained(seed=0)
    task = tiny_task(6, 2)
    chosen = {"chosen": agent.place(task)}

    def ticking() -> float:
        clock.advance(1.0)
        return clock()

    timing = cal.Timing(kernel_timing(FAST).step_ms, None, ticking)
    options = quiet(rounds=3, budget_s=1e-6, incumbent="chosen")
    res = cal.verify(agent, task, 2, FAST, options, extra=chosen, timing=timing)
    assert {len(p.rounds_ms) for p in res.plans} == {0}  # out of time before the first
    assert res.winner.name.split("=")[0] == "chosen"
    res = cal.verify(
        agent, task, 2, FAST, quiet(rounds=2, budget_s=1e6, incumbent="chosen"), extra=chosen
    )
    assert {len(p.rounds_ms) for p in res.plans} == {2}


def test_a_round_the_budget_cuts_short_is_dropped(clock):
    """Real kernels, timed on a clock the test moves: each measurement takes 0.1 s on it,
    and the budget ends 1.5 measurements into the fourth round (past the first three,
    which may stretch it). The fourth round is cut short and dropped: every plan keeps
    the same 3 whole rounds, and nothing was measured past the budget."""
    from torchrec_dreamshard.verification.verification import kernel_timing

    agent = DreamShard.untrained(seed=0)
    task = tiny_task(6, 2)
    chosen = {"chosen": agent.place(task)}
    n = len(cal.verify_candidates(agent, task, 2, chosen, None))
    real, calls = kernel_timing(FAST), []

    def step_ms(task: Task, placement: list[int]) -> float:
        ms = real.step_ms(task, placement)  # FBGEMM's kernels, really run
        calls.append(ms)
        clock.advance(0.1)
        return ms

    budget = (3 * n + 1.5) * 0.1
    start = clock()
    res = cal.verify(
        agent,
        task,
        2,
        FAST,
        quiet(rounds=50, budget_s=budget, drop=False),  # the budget alone cuts rounds
        extra=chosen,
        timing=cal.Timing(step_ms, None, clock),
    )
    assert len(res.plans) == n and res.left_out == 0
    assert {len(p.rounds_ms) for p in res.plans} == {3}
    assert len(calls) == 3 * n + 1  # the fourth round's one measurement, dropped
    assert sorted(ms for p in res.plans for ms in p.rounds_ms) == sorted(calls[: 3 * n])
    assert clock() - start == pytest.approx((3 * n + 1) * 0.1)
    assert clock() - start <= budget
    assert res.seconds == pytest.approx(clock() - start)


def test_verification_is_measured_once_per_machine_and_plan_set(tmp_path, monkeypatch):
    from torchrec_dreamshard.measure import placement_timing

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    agent = DreamShard.untrained(seed=0)
    task = tiny_task(6, 2)
    first = cal.verify(agent, task, 2, FAST, quiet(rounds=2, cache=True))
    assert not first.cached and list((tmp_path / "xdg").rglob("verification_*.json"))

    def refuse(*args, **kwargs):
        raise AssertionError("measured again although this machine's cache holds the plans")

    monkeypatch.setattr(placement_timing, "measure_placement", refuse)
    again = cal.verify(agent, task, 2, FAST, quiet(rounds=2, cache=True))
    assert again.cached and "cache" in again.lines()[0]
    assert [(p.name, p.rounds_ms) for p in again.plans] == [
        (p.name, p.rounds_ms) for p in first.plans
    ]
    other = Task(tables=task.tables, num_devices=2, memory_bytes=10**7, batch_size=128)
    with pytest.raises(AssertionError, match="measured again"):  # another batch: measured
        cal.verify(agent, other, 2, FAST, quiet(rounds=2, cache=True))
    with pytest.raises(AssertionError, match="measured again"):  # not asked to cache
        cal.verify(agent, task, 2, FAST, quiet(rounds=2))


@pytest.mark.parametrize(("factor", "verifies"), [(10.0, True), (1.0, False)])
def test_the_default_verifies_where_it_calibrates(factor, verifies, tmp_path, monkeypatch):
    """Automatic mode on a machine the checkpoint misprices: the recalibrated plan is
    measured against the heuristics' before it is kept, and a second plan of the same
    tables reads that measurement from the cache; where the checkpoint prices the machine
    right, nothing is measured."""
    from torchrec_dreamshard.calibration.auto import AUTO_VERIFY_K, check_machine

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    agent = DreamShard.untrained(seed=0)
    fwd, bwd = check_machine(agent, None).predicted_ms
    task = tiny_task(6, 2)
    reports = []
    for _ in range(2):
        wrapped = cal.CalibratingAgent(
            agent, config(), verify_k=None, auto=lambda: (fwd * factor, bwd * factor)
        )
        placement = wrapped.place(task)
        reports.append(wrapped.adaptation())
        assert reports[-1]["verified"] is verifies
        if verifies:
            assert placement == wrapped.last_verification.winner.placement
            assert reports[-1]["verify_plans"] >= AUTO_VERIFY_K
    if verifies:
        assert [r["verify_cached"] for r in reports] == [False, True]
        assert reports[0]["verify_chosen"] == reports[1]["verify_chosen"]


def plan(name, rounds, heuristic=False):
    return cal.VerifiedPlan(name, [0], 1.0, 0.0, rounds_ms=rounds, heuristic=heuristic)


def test_verification_keeps_the_best_heuristic_unless_a_plan_beat_it_every_round_clearly():
    ref = plan("heuristic:size_greedy", [10.0, 10.0, 10.0], heuristic=True)
    other = plan("heuristic:dim_greedy", [11.0, 12.0, 13.0], heuristic=True)
    lucky = plan("policy_greedy", [8.0, 9.0, 10.5])  # lower median, slower in one round
    ranked = cal.rank_measured([lucky, other, ref])
    assert ranked[0] is ref and [p.name for p in ranked[1:]] == ["policy_greedy", other.name]
    steady = plan("policy_sample0", [9.5, 9.6, 9.4])  # faster in every round, by 4%
    assert cal.rank_measured([lucky, ref, steady])[0] is steady
    assert cal.rank_measured([lucky, steady])[0] is lucky  # no heuristic: lowest median
    # faster in every round but by 1%, within what identical plans move: no replacement
    # (among several challengers as good as the incumbent, one wins every round by luck)
    close = plan("policy_sample1", [9.9, 9.8, 9.9])
    assert cal.rank_measured([lucky, ref, close])[0] is ref
    assert cal.rank_measured([close, plan("chosen", [10.0] * 3)], incumbent="chosen")[0].name == (
        "chosen"
    )


def test_the_chosen_plan_stands_unless_a_plan_beat_it_every_round():
    chosen = plan("chosen", [10.0, 14.0, 10.0])  # a noisy round; the median is 10
    ref = plan("heuristic:size_greedy", [9.0, 9.5, 11.0], heuristic=True)  # lower median
    assert cal.rank_measured([ref, chosen], incumbent="chosen")[0] is chosen
    assert cal.rank_measured([ref, chosen])[0] is ref  # the heuristic as incumbent
    steady = plan("heuristic:dim_greedy", [9.0, 9.0, 9.0], heuristic=True)
    assert cal.rank_measured([ref, chosen, steady], incumbent="chosen")[0] is steady
    same = plan("chosen=size_greedy", [10.0, 10.0, 10.0], heuristic=True)  # also a heuristic
    assert cal.rank_measured([same, steady], incumbent="chosen")[0] is steady
    with pytest.raises(ValueError, match="no measured plan is named 'chosen'"):
        cal.rank_measured([ref, steady], incumbent="chosen")
    # one round is one draw of the noise: it does not replace the chosen plan
    once = [plan("chosen", [10.0]), plan("heuristic:dim_greedy", [5.0], heuristic=True)]
    assert cal.rank_measured(once, incumbent="chosen")[0].name == "chosen"
    assert cal.rank_measured(once)[0].name == "heuristic:dim_greedy"  # the heuristic rule
    unmeasured = [plan("policy", []), plan("heuristic:size_greedy", [], heuristic=True)]
    assert cal.rank_measured(unmeasured)[0].name == "heuristic:size_greedy"


def test_plan_task_calibrates_then_verifies():
    agent = DreamShard.untrained(seed=0)
    task = tiny_task(6, 2)
    out = cal.plan_task(
        agent,
        task,
        calibration=config(),
        verification=cal.VerificationSettings(k=2, options=cal.VerifyOptions(rounds=1)),
    )
    assert out.calibration is not None and out.verification is not None
    assert out.placement == out.verification.winner.placement
    assert out.agent is out.calibration.agent


def test_plan_task_keeps_the_chosen_plan_and_verifies_no_split_plan(monkeypatch):
    """``chosen`` is the agent's placement before verification; with ``splits`` the split
    search places (what ``dreamshard plan`` does), and a plan that splits tables is not
    verified."""
    from types import SimpleNamespace

    from torchrec_dreamshard.calibration import planning
    from torchrec_dreamshard.policy.protocol import PlaceSettings
    from torchrec_dreamshard.policy.split_search import plan_with_splits

    agent, task = DreamShard.untrained(seed=0), tiny_task(6, 2)
    other = [1 - d for d in agent.place(task, seed=3)]
    verified = []

    def fake_verify(planner, task, k, *args, **kwargs):
        verified.append(k)
        measured = SimpleNamespace(placement=other, rounds_ms=[1.0])  # one round measured
        return SimpleNamespace(winner=measured, plans=[measured])

    monkeypatch.setattr(planning, "verify", fake_verify)
    two = cal.VerificationSettings(k=2)
    for splits in (False, True):
        out = cal.plan_task(agent, task, how=PlaceSettings(seed=3), verification=two, splits=splits)
        assert out.chosen == agent.place(task, seed=3) and out.placement == other
        assert (out.split is not None) is splits
    big = TableSpec(name="big", rows=30_000, dim=64, pooling_factor=1.0)  # 7.7 MB
    oversized = Task(
        tables=[*task.tables, big],
        num_devices=2,
        memory_bytes=5 * 10**6,
        batch_size=64,
        allow_oversized=True,
    )
    out = cal.plan_task(agent, oversized, how=PlaceSettings(seed=3), verification=two, splits=True)
    assert out.split.sharded.columns and out.verification is None and verified == [2, 2]
    assert (
        out.placement
        == out.chosen
        == plan_with_splits(agent, oversized, PlaceSettings(seed=3)).placement
    )


# -- the CLI ------------------------------------------------------------------------------


@pytest.fixture()
def files(tmp_path, monkeypatch):
    """A task and a checkpoint for the CLI tests. The CLI calibrates with the default
    reference-drift check, which on a loaded machine discards the kernels these tests
    count; the drift is not what they check (``test_verification``'s drift tests do), so
    the reference reads as steady here."""
    from torchrec_dreamshard.calibration import fine_tuning
    from torchrec_dreamshard.policy.checkpoint import save_checkpoint

    monkeypatch.setattr(fine_tuning, "lasting_drift", lambda before, config, limit: 0.0)
    tiny_task(6, 2).save(tmp_path / "task.json")
    save_checkpoint(DreamShard.untrained(seed=0), tmp_path / "agent.pt")
    return tmp_path


def test_cli_plan_calibrate_verify_then_reuse(files, capsys, monkeypatch, run_cli):
    argv = ["plan", str(files / "task.json"), "--checkpoint", str(files / "agent.pt")]
    argv += ["--calibrate", "--budget-s", "30", "--verify", "2", "--verify-rounds", "1"]
    out = files / "plan.json"
    assert run_cli([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "calibration:" in printed and "verification:" in printed
    plan = json.loads(out.read_text())
    assert plan["calibration"]["measured"] >= 6 and plan["calibration"]["reused"] == 0
    winner = plan["verification"]["winner"]
    assert plan["verification"]["plans"][0]["name"] == winner
    forbid_kernel_timing(monkeypatch)
    assert run_cli(argv[:-4]) == 0  # calibration only: everything is in the store
    assert "calibration: 0 kernels measured" in capsys.readouterr().out


def test_cli_calibrate_exports_a_checkpoint(files, capsys, run_cli):
    from torchrec_dreamshard.policy.checkpoint import load_checkpoint

    store = files / "costs.sqlite"
    export = files / "mine.pt"
    argv = ["calibrate", str(files / "task.json"), "--checkpoint", str(files / "agent.pt")]
    assert run_cli([*argv, "--store", str(store), "--export", str(export)]) == 0
    printed = capsys.readouterr().out
    assert f"reused from {store}" in printed and f"wrote {export}" in printed
    agent = load_checkpoint(export)
    assert agent.meta["calibrated"]["kernels"] >= 6
    bad = ["calibrate", str(files / "task.json"), "--store", str(files / "no" / "c.sqlite")]
    assert run_cli([*bad, "--checkpoint", str(files / "agent.pt")]) == 2
    assert "folder does not exist" in capsys.readouterr().err


# -- under a process group ----------------------------------------------------------------


def planner_worker(rank: int, world: int, port: int, out_dir: str, store: str) -> None:
    """Every rank asks for a calibrated, verified plan; rank 0 calibrates and plans."""
    import torch.distributed as dist
    from test_planner_distributed import LOCAL_BATCH, NUM_TABLES, build_model
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import ParameterConstraints, Topology

    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.ranks.spawn import exit_spawned_rank, local_process_group

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    table_wise = ParameterConstraints(sharding_types=["table_wise"])
    report: dict = {}
    with local_process_group(rank, world, port):
        planner = DreamShardPlanner(
            topology=Topology(world_size=world, compute_device="cpu"),
            batch_size=LOCAL_BATCH,
            agent=DreamShard.untrained(seed=0),
            calibrate=config(budget_s=20.0, store=store),
            verify=2,
            # table-wise: the policy places (and verification measures) every table on
            # any machine; the type choice's calibration is tested in one process below
            constraints={f"t{i}": table_wise for i in range(NUM_TABLES)},
        )
        try:
            plan = planner.collective_plan(
                build_model(), [EmbeddingBagCollectionSharder()], dist.GroupMember.WORLD
            )
            report["plan"] = str(plan)
            report["placement"] = planner.last_placement
            report["calibrated"] = planner.adaptation["calibrated"]  # rank 0's, sent
            report["verified"] = planner.adaptation["verified"]
            report["own_calibration"] = planner.agent.current is not planner.agent.prior
        except Exception as exc:
            report["error"] = f"{type(exc).__name__}: {exc}"
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(report))
    exit_spawned_rank()


@pytest.mark.slow
@pytest.mark.parametrize("fail", [False, True])
def test_planner_calibrates_on_rank_0_under_two_gloo_ranks(fail, tmp_path):
    import torch.multiprocessing as mp

    from torchrec_dreamshard.ranks.spawn import free_port

    store = tmp_path / ("missing" if fail else "") / "calibration.sqlite"
    # no wall-clock bound: a hang never reaches an assertion after the spawn, and a bound
    # fails only a loaded CI core (the time calibration takes is the benchmarks')
    mp.spawn(planner_worker, args=(2, free_port(), str(tmp_path), str(store)), nprocs=2)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    if fail:
        for r in reports:
            assert "folder does not exist" in r["error"] and "missing" in r["error"], r
        assert "rank 0 could not plan" in reports[1]["error"]
        return
    assert all("error" not in r for r in reports), reports
    assert reports[0]["plan"] == reports[1]["plan"]
    assert reports[0]["placement"] == reports[1]["placement"]
    assert reports[0]["calibrated"] and reports[0]["verified"]
    assert reports[1]["calibrated"]  # every rank reports rank 0's adaptation
    assert reports[0]["own_calibration"] and not reports[1]["own_calibration"]  # rank 0's


def test_planner_calibrate_and_verify_arguments():
    from torchrec.distributed.planner.types import Topology

    from torchrec_dreamshard.calibration.auto import AUTO_BUDGET_S
    from torchrec_dreamshard.planner import DreamShardPlanner

    topo = Topology(world_size=2, compute_device="cpu")
    agent = DreamShard.untrained(seed=0)
    off = DreamShardPlanner(topology=topo, agent=agent, calibrate=False)
    assert off.agent.prior is agent and off.adapt.calibration is None
    assert off.adaptation["mode"] == "off"
    default = DreamShardPlanner(topology=topo, agent=agent)
    assert default.agent.prior is agent and default.adapt.automatic
    assert default.adapt.calibration.budget_s == AUTO_BUDGET_S
    assert default.adaptation["mode"] == "auto"
    planner = DreamShardPlanner(topology=topo, agent=agent, calibrate=5, verify=2)
    assert planner.adapt.calibration.budget_s == 5.0 and planner.adapt.verify_k == 2
    assert planner.adaptation["mode"] == "on" and not planner.adapt.automatic
    assert default.adapt.verify_k is None  # automatic: verifies where the check calibrates
    assert DreamShardPlanner(topology=topo, agent=agent, calibrate=5).adapt.verify_k == 0
    assert DreamShardPlanner(topology=topo, agent=agent, verify=0).adapt.verify_k == 0
    with pytest.raises(ValueError, match="verify must be None \\(automatic\\) or an integer >= 0"):
        DreamShardPlanner(topology=topo, agent=agent, verify=-1)
    with pytest.raises(ValueError, match="calibrate must be None \\(automatic\\), False, True"):
        DreamShardPlanner(topology=topo, agent=agent, calibrate="yes")


@pytest.mark.parametrize(
    ("factor", "calibrates"),
    [(1.0, False), (1.2, False), (1 / 1.2, False), (10.0, True), (0.5, True)],
)
def test_the_default_calibrates_where_the_checkpoint_misprices_the_reference_kernel(
    factor, calibrates
):
    """Automatic mode: the reference kernel measured at ``factor`` times the checkpoint's
    prediction; beyond 25% either way the planner calibrates, and the stats say why."""
    from torchrec_dreamshard.calibration.auto import check_machine

    agent = DreamShard.untrained(seed=0)
    fwd, bwd = check_machine(agent, None).predicted_ms
    measured = (fwd * factor, bwd * factor)
    wrapped = cal.CalibratingAgent(agent, config(), auto=lambda: measured)
    assert wrapped.calibration_enabled is calibrates
    report = wrapped.adaptation()
    assert report["reference_error"] == pytest.approx(1 / factor - 1)
    assert ("calibrating on this machine" in report["why"]) is calibrates
    assert report["calibrated"] is False  # nothing placed yet


def test_the_default_plans_with_the_checkpoint_when_the_reference_is_not_measured():
    agent = DreamShard.untrained(seed=0)
    wrapped = cal.CalibratingAgent(agent, config(), auto=lambda: None)
    task = tiny_task(6, 2)
    placement = wrapped.place(task, mode="greedy")
    assert placement == list(agent.place(task, mode="greedy"))
    assert wrapped.last_calibration is None
    assert "not measured" in wrapped.adaptation()["why"]


def test_calibration_sets_the_all_to_all_to_the_machines_model_at_the_tasks_batch():
    """The local backend charges the fitted all-to-all model; after calibration the cost
    network predicts exactly that, at any batch size (the prior's head has no batch)."""
    from torchrec_dreamshard.cost.collective_models import load_all_to_all_model

    model = load_all_to_all_model()  # the private test model
    agent = DreamShard.untrained(seed=0)
    for batch in (64, 1024):
        task = Task(
            tables=tiny_task(6, 3).tables, num_devices=3, memory_bytes=10**7, batch_size=batch
        )
        tuned = cal.calibrate(agent, task, config()).agent
        placement = [0, 0, 1, 1, 2, 2]
        dims = [sum(task.tables[i].dim for i in range(6) if placement[i] == d) for d in range(3)]
        want = model.device_comm_ms(dims, batch)
        got = tuned.predict(task, placement).comm_ms
        assert got == pytest.approx(want, rel=0.01)
        assert agent.predict(task, placement).comm_ms != pytest.approx(want, rel=0.01)


def test_the_type_choice_prices_with_the_calibration_that_places(monkeypatch):
    """When the search space offers other sharding types, the planner calibrates once, in
    the profile step before TorchRec's loop; the type choice then prices with the
    calibrated cost network, and placing the table-wise tables uses that calibration
    instead of measuring again."""
    from test_planner_distributed import LOCAL_BATCH, build_model
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import ParameterConstraints, Topology

    from torchrec_dreamshard.calibration import calibrating_agent, fine_tuning, planning
    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.planner.stages import proposers
    from torchrec_dreamshard.profile import build

    runs = []

    def counted(*args, **kwargs):
        runs.append(args[1])
        return fine_tuning.calibrate(*args, **kwargs)

    # the profile step calibrates; prepare() and plan_task() would, were it not frozen
    for module in (calibrating_agent, planning, build):
        monkeypatch.setattr(module, "calibrate", counted)
    # three tables may only be table-wise, so the policy places them whatever this
    # machine's calibrated kernels make the type choice do with the other three
    table_wise = ParameterConstraints(sharding_types=["table_wise"])
    planner = DreamShardPlanner(
        topology=Topology(world_size=2, compute_device="cpu"),
        batch_size=LOCAL_BATCH,
        agent=DreamShard.untrained(seed=0),
        calibrate=config(budget_s=10.0),
        constraints={f"t{i}": table_wise for i in range(3)},
    )
    priced = []
    real = proposers.TypeChooser

    def spying(agent, *args, **kwargs):
        priced.append(agent.without_measuring)  # the agent the choice's cost network is read from
        return real(agent, *args, **kwargs)

    monkeypatch.setattr(proposers, "TypeChooser", spying)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        planner.plan(build_model(), [EmbeddingBagCollectionSharder()])
    assert len(runs) == 1, "calibrated more than once"
    assert planner.adaptation["calibrated"]
    # the type choice priced with the calibrated agent, which placed too
    assert priced == [planner.agent.current]
    assert priced[0] is not planner.agent.prior


def oversized_task() -> Task:
    """Issue 32's task, scaled down: ``big`` (20,000 x 128) fits no device, eight smaller
    tables do; each of 2 devices has 1.15x half of the tables' bytes."""
    big = TableSpec(name="big", rows=20_000, dim=128, pooling_factor=8.0)
    small = [
        TableSpec(name=f"s{i}", rows=2_000 + 300 * i, dim=32, pooling_factor=4.0 + i)
        for i in range(8)
    ]
    tables = [big, *small]
    memory = int(1.15 * sum(t.size_bytes for t in tables) / 2)
    assert big.size_bytes > memory
    return Task(
        tables=tables, num_devices=2, memory_bytes=memory, batch_size=256, allow_oversized=True
    )


def assert_fits_splitting_big(task: Task, out: cal.PlanOutcome) -> None:
    from torchrec_dreamshard.data.tasks import device_bytes

    assert out.split is not None and list(out.split.sharded.columns) == ["big"]
    shards = out.split.sharded.shards
    assert len(out.placement) == len(shards.tables)
    used = device_bytes(shards, out.placement)
    assert all(u <= m for u, m in zip(used, task.memory, strict=True))
    placed = {shards.tables[k].name: d for k, d in enumerate(out.placement)}
    big_devices = [d for name, d in placed.items() if name.startswith("big")]
    assert len(set(big_devices)) == len(big_devices) == 2  # its shards on distinct devices


def test_a_table_bigger_than_every_device_is_split_on_the_calibrating_path():
    """Issue 32's regression: calibrating measured fused groups of whole-table plans, and a
    table that fits no device has none (the policy raised "fits on no device"). With
    splits, calibration measures the shards the plan places, and the plan splits ``big``."""
    agent, task = DreamShard.untrained(seed=0), oversized_task()
    out = cal.plan_task(agent, task, calibration=config(budget_s=30.0), splits=True)
    assert out.calibration is not None and out.calibration.measured > 0
    assert_fits_splitting_big(task, out)
    # a calibration of the whole tables (no splits asked for) still measures: the groups
    # then come from the plans that exist (the heuristics' plans fail on it too)
    alone = cal.calibrate(agent, task, config(budget_s=30.0))
    assert alone.samples >= len(task.tables)


def test_the_default_on_a_mispriced_machine_splits_a_table_bigger_than_every_device(
    files, capsys, monkeypatch, run_cli
):
    """``dreamshard plan`` with no flags, on a machine whose reference kernel the
    checkpoint misprices tenfold (so the default calibrates), splits ``big`` and fits.
    ``dreamshard plan`` plans through ``DreamShardPlanner``, where a device's memory is
    TorchRec's (its storage reservation keeps 15%): the task's devices are that much
    larger, and ``big`` still fits none."""
    import dataclasses

    from torchrec_dreamshard.planner.steps import machine_sources

    task = oversized_task()
    memory = [int(m / 0.85) for m in task.memory]
    assert task.tables[0].size_bytes > max(memory)
    dataclasses.replace(task, memory_bytes=memory).save(files / "big.json")
    agent = DreamShard.untrained(seed=0)
    fwd, bwd = cal.auto.check_machine(agent, None).predicted_ms
    monkeypatch.setattr(
        machine_sources, "load_reference_ms", lambda device="cpu": (fwd * 10, bwd * 10)
    )
    out = files / "plan.json"
    argv = ["plan", str(files / "big.json"), "--checkpoint", str(files / "agent.pt")]
    assert run_cli([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "calibrating on this machine" in printed and "calibration:" in printed
    plan = json.loads(out.read_text())
    assert plan["adaptation"]["calibrated"] is True
    assert sorted(s["device"] for s in plan["shards"]["big"]) == [0, 1]
    assert all(d["bytes"] <= memory[k] for k, d in enumerate(plan["per_device"]))


def test_the_planner_splits_a_table_bigger_than_every_rank_on_the_calibrating_path():
    """The same task as a TorchRec model under ``DreamShardPlanner`` with calibration forced
    on: ``big`` is cut column-wise (``min_partition`` allows it; TorchRec's own
    ``MIN_CW_DIM`` of 128 would leave a 128-wide table one shard, calibrated or not) and
    every rank's shards fit its memory."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import ParameterConstraints, Topology
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.planner.adapters.torchrec_adapter import (
        planner_best_plan,
        planner_reserved_topology,
    )

    tables = [
        EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                           feature_names=[f"f_{t.name}"])
        for t in oversized_task().tables
    ]  # fmt: skip
    total = sum(t.num_embeddings * t.embedding_dim * 4 for t in tables)
    reserve = 0.15  # TorchRec's default storage reservation
    topology = Topology(
        world_size=2, compute_device="cpu", ddr_cap=int(1.15 * total / 2 / (1 - reserve))
    )
    model = torch.nn.Module()
    model.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    planner = DreamShardPlanner(
        topology=topology,
        batch_size=128,
        agent=DreamShard.untrained(seed=0),
        calibrate=config(budget_s=10.0),
        constraints={"big": ParameterConstraints(min_partition=32)},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = planner.plan(model, [EmbeddingBagCollectionSharder()])
    assert planner.adaptation["calibrated"] is True
    big = plan.plan["ebc"]["big"]
    assert big.sharding_type == "column_wise" and len(set(big.ranks)) == len(big.ranks) == 2
    caps = [d.storage.ddr for d in planner_reserved_topology(planner).devices]
    used = [0] * 2
    for option in planner_best_plan(planner):
        for shard in option.shards:
            used[shard.rank] += shard.storage.ddr
    assert all(u <= c for u, c in zip(used, caps, strict=True)), (used, caps)


def test_only_the_window_measured_while_the_machine_drifted_is_discarded(tmp_path, monkeypatch):
    """The reference kernel is timed after each window of kernels: the first window (the
    machine steady) is kept, the second (the reference 50% slower, for good) discarded."""
    from torchrec_dreamshard.calibration import fine_tuning

    drifts = iter([0.0, 0.5, 0.5, 0.5])
    monkeypatch.setattr(fine_tuning, "reference_ms", lambda config: 1.0)
    monkeypatch.setattr(fine_tuning, "lasting_drift", lambda before, config, limit: next(drifts))
    n = fine_tuning.WINDOW_KERNELS + 8  # two windows of single-table kernels
    tables = [TableSpec(name=f"w{i}", rows=64 + i, dim=4, pooling_factor=1.0) for i in range(n)]
    task = Task(tables=tables, num_devices=1, memory_bytes=2**30, batch_size=16)
    settings = dataclasses.replace(
        config(store=str(tmp_path / "c.sqlite"), drift_limit=0.2), max_groups=0
    )
    result = fine_tuning.calibrate(DreamShard.untrained(seed=0), task, settings)
    assert result.measured == fine_tuning.WINDOW_KERNELS  # the steady window, kept
    assert result.discarded == 8  # the window that drifted
    assert result.samples == fine_tuning.WINDOW_KERNELS and result.drift == 0.5
    assert "measured while it was steady kept" in result.note


def test_a_lasting_change_of_speed_loses_only_the_window_it_happened_in(tmp_path, monkeypatch):
    """Each window is set against the reference timed just before it: the machine 50%
    slower from the second window on (or the first timing the odd one) discards the second
    window only, and the third, measured at the new speed, is kept."""
    from torchrec_dreamshard.calibration import fine_tuning

    levels = iter([1.0, 1.5, 1.5])  # the reference after each window, ms
    seen: list[float] = []

    def lasting_drift(before, config, limit):
        seen.append(before)
        return next(levels) / before - 1.0

    monkeypatch.setattr(fine_tuning, "reference_ms", lambda config: 1.0)
    monkeypatch.setattr(fine_tuning, "lasting_drift", lasting_drift)
    n = 2 * fine_tuning.WINDOW_KERNELS + 8  # three windows of single-table kernels
    tables = [TableSpec(name=f"w{i}", rows=64 + i, dim=4, pooling_factor=1.0) for i in range(n)]
    task = Task(tables=tables, num_devices=1, memory_bytes=2**30, batch_size=16)
    settings = dataclasses.replace(
        config(store=str(tmp_path / "c.sqlite"), drift_limit=0.2), max_groups=0
    )
    result = fine_tuning.calibrate(DreamShard.untrained(seed=0), task, settings)
    assert seen == pytest.approx([1.0, 1.0, 1.5])  # each window against the one before it
    assert result.discarded == fine_tuning.WINDOW_KERNELS  # the window the speed moved in
    assert result.measured == fine_tuning.WINDOW_KERNELS + 8  # before it and after it
    assert result.drift == pytest.approx(0.5)
