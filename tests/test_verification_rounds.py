"""What a verification round buys: device sets several candidates share are timed once per
round (real kernels), and candidates clearly behind after a round drop out (FAKE,
deterministic figures on a clock the test moves: nothing here asserts how fast anything
ran)."""

from __future__ import annotations

import math

import pytest
from conftest import FakeClock

from torchrec_dreamshard import calibration as cal
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure import MeasureConfig
from torchrec_dreamshard.measure.device_sets import DeviceSetTimes, distinct_device_sets
from torchrec_dreamshard.measure.placement_timing import measure_placement
from torchrec_dreamshard.policy import DreamShard
from torchrec_dreamshard.verification.dropping import DROP_FLOOR, Dropping
from torchrec_dreamshard.verification.verification import heuristic_plans

FAST = MeasureConfig(rounds=1, iters=2, warmup=1)


@pytest.fixture(autouse=True)
def private_store(tmp_path, monkeypatch, comm_model):
    """A calibration store in ``tmp_path`` and a known all-to-all model."""
    monkeypatch.setenv(cal.STORE_ENV, str(tmp_path / "calibration.sqlite"))


def tiny_task(num_tables: int = 6, num_devices: int = 3) -> Task:
    tables = [
        TableSpec(name=f"t{i}", rows=400 * (i + 1), dim=8 * (1 + i % 2), pooling_factor=1.0 + i)
        for i in range(num_tables)
    ]
    return Task(tables=tables, num_devices=num_devices, memory_bytes=10**7, batch_size=64)


# ---------------------------------------------------------------- shared device sets


def test_real_kernels_a_device_set_two_placements_share_is_timed_once(comm_model):
    """Real kernels: two placements that put tables {0, 1} on device 0 and differ on the
    other devices, measured in one round: 5 device sets timed for their 6 devices, and
    device 0's figure is the very same in both. A new round times it again."""
    task = tiny_task()
    a, b = [0, 0, 1, 1, 2, 2], [0, 0, 1, 2, 1, 2]
    shared = DeviceSetTimes()
    ma = measure_placement(task, a, FAST, comm=comm_model, shared=shared)
    mb = measure_placement(task, b, FAST, comm=comm_model, shared=shared)
    assert ma.ok and mb.ok
    assert (shared.timed, shared.devices) == (5, 6) == (distinct_device_sets(task, [a, b]), 6)
    assert ma.per_device[0].fwd_ms == mb.per_device[0].fwd_ms > 0
    assert ma.per_device[0].bwd_ms == mb.per_device[0].bwd_ms > 0
    assert ma.step_ms == max(d.total_ms for d in ma.per_device)
    shared.new_round()
    measure_placement(task, b, FAST, comm=comm_model, shared=shared)
    assert (shared.timed, shared.devices) == (8, 9)  # a new round shares nothing before it


def test_device_set_times_refuse_another_task_and_the_distributed_backend(comm_model):
    shared = DeviceSetTimes()
    measure_placement(tiny_task(), [0, 0, 1, 1, 2, 2], FAST, comm=comm_model, shared=shared)
    with pytest.raises(ValueError, match="one task"):
        measure_placement(tiny_task(6, 2), [0, 0, 1, 1, 0, 1], FAST, comm=comm_model, shared=shared)
    with pytest.raises(ValueError, match="local backend"):
        measure_placement(tiny_task(), [0] * 6, FAST, backend="distributed", shared=shared)


def test_real_kernels_verification_times_shared_device_sets_once():
    """Real kernels through :func:`verify`: the planner's plan and a plan that differs from
    it on two devices (a refinement) share a device set; the verification counts fewer
    device sets timed than the candidates' devices, and says so."""
    agent, task = DreamShard.untrained(seed=0), tiny_task()
    chosen = [0, 0, 1, 1, 2, 2]
    refined = [0, 0, 1, 2, 1, 2]
    options = cal.VerifyOptions(rounds=2, incumbent="chosen", noise=cal.NoiseLimits.off())
    res = cal.verify(agent, task, 2, FAST, options, extra={"chosen": chosen, "refined": refined})
    rounds = {len(p.rounds_ms) + len(p.earlier_ms) for p in res.plans}
    devices = sum(len({d for d in p.placement}) for p in res.plans)
    assert max(rounds) == 2
    # every plan measured in both rounds: as many devices as the plans hold, twice
    if not res.dropped:
        assert res.candidate_devices == 2 * devices
    assert 0 < res.devices_timed < res.candidate_devices
    sharing = f"timed {res.devices_timed} device sets for {res.candidate_devices} candidate"
    assert sharing in res.summary() and any(sharing in line for line in res.lines())
    assert res.to_dict()["devices_timed"] == res.devices_timed


# ---------------------------------------------------------------- dropping out


class Figures:
    """FAKE timing: each placement's step is its scripted ms times ``1 + jitter`` on odd
    rounds (a quiet machine's small spread), ``default`` ms for a placement not scripted;
    every measurement counted."""

    def __init__(self, ms: dict[tuple[int, ...], float], default: float = 10.0) -> None:
        self.ms, self.default, self.jitter = ms, default, 0.01
        self.counts: dict[tuple[int, ...], int] = {}
        self.clock = FakeClock()

    def step_ms(self, task: Task, placement: list[int]) -> float:
        key = tuple(placement)
        n = self.counts.get(key, 0)
        self.counts[key] = n + 1
        return self.ms.get(key, self.default) * (1.0 + self.jitter * (n % 2))

    def timing(self) -> cal.Timing:
        return cal.Timing(self.step_ms, None, self.clock)


def scripted_plans():
    """An agent, a task, the planner's plan, TorchRec's plan, and a plan no heuristic
    makes (every table on device 0)."""
    agent, task = DreamShard.untrained(seed=0), tiny_task(6, 2)
    chosen = list(agent.place(task))
    torchrec = [1 - d for d in chosen]
    far = [0] * 6
    others = {tuple(p) for p in heuristic_plans(task).values()}
    assert not {tuple(chosen), tuple(torchrec), tuple(far)} & others
    return agent, task, chosen, torchrec, far


def verify_figures(figures: Figures, drop: bool = True, **plans) -> cal.VerifyResult:
    agent, task, chosen, torchrec, far = scripted_plans()
    options = cal.VerifyOptions(rounds=4, incumbent="chosen", drop=drop)
    extra = {"chosen": chosen, **({"far": far} if plans.get("far") else {})}
    return cal.verify(
        agent,
        task,
        2,
        FAST,
        options,
        extra=extra,
        baselines={"torchrec_ours": torchrec},
        timing=figures.timing(),
    )


def test_a_plan_far_behind_drops_out_and_torchrecs_plan_never_does():
    """FAKE figures: the planner's plan 9 ms, the heuristics' 9.5 ms (within the 10%
    floor), TorchRec's 13 ms (44% behind, but never dropped) and a plan of every table on
    one device 15 ms (67% behind, slower every round): it drops out after round 2 and is
    measured no more; the rest are measured in all 4 rounds, and the planner's plan kept."""
    agent, task, chosen, torchrec, far = scripted_plans()
    heur = {tuple(p): 9.5 for p in heuristic_plans(task).values()}
    figures = Figures({**heur, tuple(chosen): 9.0, tuple(torchrec): 13.0, tuple(far): 15.0})
    res = verify_figures(figures, far=True)
    dropped = {p.name: p for p in res.dropped}
    assert list(dropped) == ["far"] and figures.counts[tuple(far)] == 2
    record = dropped["far"].dropped
    assert record.after_round == 2 and record.pass_index == 0 and record.fastest == "chosen"
    assert record.behind == pytest.approx(15.0 / 9.0 - 1.0) and record.limit == DROP_FLOOR
    assert dropped["far"].measured and dropped["far"].measured_ms == pytest.approx(15.075)
    assert res.baseline is not None and len(res.baseline.rounds_ms) == 4
    assert figures.counts[tuple(torchrec)] == 4
    assert all(len(p.rounds_ms) == 4 for p in res.plans if p.dropped is None)
    assert res.winner.name == "chosen" and res.plans[-1].name == "far"
    assert "1 plan clearly behind dropped out" in res.summary()
    row = next(line for line in res.lines() if line.strip().startswith("far "))
    assert "dropped after round 2: 67% behind the planner's plan (limit 10%)" in row
    assert res.to_dict()["plans"][-1]["dropped"]["after_round"] == 2
    assert res.not_measured == []


def test_where_nothing_drops_out_the_ranking_is_what_it_was():
    """FAKE figures within 10% of each other: nothing drops out, and the verification
    with dropping gives the very plans, rounds and order it gives without."""
    agent, task, chosen, torchrec, _ = scripted_plans()
    heur = {tuple(p): 9.4 + 0.1 * i for i, p in enumerate(heuristic_plans(task).values())}
    ms = {**heur, tuple(chosen): 9.0, tuple(torchrec): 9.8}
    on, off = verify_figures(Figures(ms, 9.5)), verify_figures(Figures(ms, 9.5), drop=False)
    assert not on.dropped and not off.dropped
    assert [(p.name, p.rounds_ms, p.measured_ms) for p in on.plans] == [
        (p.name, p.rounds_ms, p.measured_ms) for p in off.plans
    ]
    assert on.fallback == off.fallback and on.winner.name == "chosen"


def test_the_plan_the_ranking_would_keep_never_drops_out():
    """A second pass pools the first's rounds where the machine is noisy: there, plan Y
    (21% behind X in this pass) is the plan the noisy ranking keeps (X lost to TorchRec's
    in the first pass), so Y stays; in a first pass, with nothing to pool, Y drops out."""
    base = cal.VerifiedPlan("torchrec_ours", [0], 1.0, 0.0, baseline=True)
    x, y = cal.VerifiedPlan("x", [1], 1.0, 0.0), cal.VerifiedPlan("y", [1, 0], 1.0, 0.0)
    rounds = [{0: 10.0, 1: 7.0, 2: 8.5}, {0: 10.0, 1: 7.0, 2: 8.5}]
    second = Dropping([base, x, y])
    second.next_pass([{0: 10.0, 1: 11.0, 2: 8.0}] * 3)
    second.after_round(rounds, pass_index=1)
    assert second.dropped == {}
    first = Dropping([base, x, y])
    first.after_round(rounds, pass_index=0)
    assert list(first.dropped) == [2]
    assert first.dropped[2].behind == pytest.approx(8.5 / 7.0 - 1.0)
    assert first.active() == [0, 1]
    off = Dropping([base, x, y], enabled=False)
    off.after_round(rounds, pass_index=0)
    assert off.dropped == {}


def test_a_noisy_round_raises_the_bar():
    """The limit is 3x the rounds' spread where that is over the 10% floor: a plan 25%
    behind stays when the rounds spread 10%, and drops out when they are quiet."""
    base = cal.VerifiedPlan("torchrec_ours", [0], 1.0, 0.0, baseline=True)
    fast, slow = cal.VerifiedPlan("a", [1], 1.0, 0.0), cal.VerifiedPlan("b", [1, 0], 1.0, 0.0)
    noisy = [{0: 10.0, 1: 8.0, 2: 10.0}, {0: 11.0, 1: 8.8, 2: 11.0}]
    loud = Dropping([base, fast, slow])
    loud.after_round(noisy, 0)
    assert loud.dropped == {}
    quiet = Dropping([base, fast, slow])
    quiet.after_round([{0: 10.0, 1: 8.0, 2: 10.0}] * 2, 0)
    assert list(quiet.dropped) == [2] and math.isclose(quiet.dropped[2].limit, DROP_FLOOR)
