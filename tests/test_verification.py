"""Verification against TorchRec's plan, and on a busy machine.

The decision tests measure nothing: they hand :func:`~torchrec_dreamshard.calibration.
verify` a FAKE, DETERMINISTIC timing source (:class:`ScriptedTiming`: scripted step times
and reference-kernel times, and a clock that moves only when the test moves it) so that
noise, drift and the budget are exactly what the test says. The
tests marked "real kernels" time FBGEMM kernels on a tiny task.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from conftest import FakeClock

from torchrec_dreamshard import calibration as cal
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure import MeasureConfig
from torchrec_dreamshard.policy import DreamShard, FixedPlan, PlaceSettings
from torchrec_dreamshard.verification.noise import sign_test_wins

FAST = MeasureConfig(rounds=1, iters=2, warmup=1)


@pytest.fixture(autouse=True)
def private_store(tmp_path, monkeypatch, comm_model):
    """A calibration store in ``tmp_path`` and a known all-to-all model."""
    monkeypatch.setenv(cal.STORE_ENV, str(tmp_path / "calibration.sqlite"))


def tiny_task(num_tables: int = 6, num_devices: int = 2) -> Task:
    tables = [
        TableSpec(name=f"t{i}", rows=500 * (i + 1), dim=8 * (1 + i % 2), pooling_factor=1.0 + i)
        for i in range(num_tables)
    ]
    return Task(tables=tables, num_devices=num_devices, memory_bytes=10**7, batch_size=64)


class ScriptedTiming:
    """FAKE timing source for the decision tests (no kernel is timed): a plan's step
    time is ``step(plan kind, measurement number of that plan)``, the reference kernel's
    is the next of ``references`` (the last repeats). Plan kinds: ``"torchrec"`` (the
    baseline's placement), ``"chosen"`` (the agent's choice) or ``"other"``."""

    def __init__(
        self,
        kinds: dict[tuple[int, ...], str],
        step: Callable[[str, int], float],
        references: list[float],
    ) -> None:
        self.kinds, self.step, self.references = kinds, step, list(references)
        self.counts: dict[tuple[int, ...], int] = {}
        self.reference_calls = 0
        self.clock = FakeClock()  # still: a measurement takes no time unless a test says

    def step_ms(self, task: Task, placement: list[int]) -> float:
        key = tuple(placement)
        n = self.counts.get(key, 0)
        self.counts[key] = n + 1
        return self.step(self.kinds.get(key, "other"), n)

    def reference_ms(self) -> float:
        k = min(self.reference_calls, len(self.references) - 1)
        self.reference_calls += 1
        return self.references[k]

    def timing(self) -> cal.Timing:
        return cal.Timing(self.step_ms, self.reference_ms, self.clock)


def scripted(step: Callable[[str, int], float], references: list[float]):
    """An agent that chose a plan, TorchRec's plan (another placement), and a
    :class:`ScriptedTiming` over them."""
    agent, task = DreamShard.untrained(seed=0), tiny_task()
    chosen = agent.place(task)
    torchrec = [1 - d for d in chosen]
    kinds = {tuple(chosen): "chosen", tuple(torchrec): "torchrec"}
    return agent, task, chosen, torchrec, ScriptedTiming(kinds, step, references)


def run(agent, task, chosen, torchrec, timing, **options):
    opts = cal.VerifyOptions(incumbent="chosen", **options)
    return cal.verify(
        agent,
        task,
        2,
        FAST,
        opts,
        extra={"chosen": chosen},
        baselines={"torchrec_ours": torchrec},
        timing=timing.timing(),
    )


def test_torchrecs_plan_is_measured_and_a_plan_faster_every_round_is_kept():
    """FAKE timing: the chosen plan is 10% faster than TorchRec's in every round, the rest
    20% slower; quiet rounds, a steady reference."""
    speed = {"chosen": 9.0, "torchrec": 10.0, "other": 12.0}
    agent, task, chosen, torchrec, timing = scripted(lambda k, n: speed[k], [5.0])
    res = run(agent, task, chosen, torchrec, timing)
    base = res.baseline
    assert base is not None and base.placement == torchrec and base.rounds_ms == [10.0] * 3
    assert res.winner.placement == chosen and res.fallback is None
    assert len(res.passes) == 1 and not res.passes[0].noisy
    assert res.margins()["vs_torchrec"] == pytest.approx(0.9)
    line = res.summary()
    assert line.startswith(f"verified {len(res.plans)} plans in ")
    assert "kept the planner's plan, 10.0% faster than TorchRec's" in line
    assert "faster than the best heuristic's, measured" in line


def test_a_plan_that_does_not_beat_torchrecs_beyond_the_noise_gives_way_to_it():
    """FAKE timing: the chosen plan has the lower median but lost one round of three to
    TorchRec's, so TorchRec's plan is kept; the rounds themselves are quiet."""
    rounds = {"chosen": [9.0, 10.5, 9.0], "torchrec": [10.0, 10.0, 10.0], "other": [12.0] * 3}
    agent, task, chosen, torchrec, timing = scripted(lambda k, n: rounds[k][n], [5.0])
    res = run(agent, task, chosen, torchrec, timing)
    assert res.winner.baseline and res.winner.placement == torchrec
    assert res.fallback is None  # the ranking itself kept it
    assert "kept TorchRec's plan" in res.summary()


def test_noisy_rounds_are_measured_again_and_then_the_safer_plan_is_kept():
    """FAKE timing: the plans' rounds swing by 60% out of step with each other (a busy
    machine): the chosen plan has the lower median but loses every other pairing to
    TorchRec's (and the heuristics'). The verification measures a second pass, as noisy,
    and keeps TorchRec's plan, saying so."""
    base = {"chosen": 8.0, "torchrec": 10.0, "other": 12.0}

    def swinging(kind: str, n: int) -> float:
        odd = n % 2 == (1 if kind == "chosen" else 0)
        return base[kind] * (1.6 if odd else 1.0)

    agent, task, chosen, torchrec, timing = scripted(swinging, [5.0])
    res = run(agent, task, chosen, torchrec, timing)
    assert [p.noisy for p in res.passes] == [True, True]
    assert all(timing.counts[tuple(p.placement)] == 6 for p in res.plans)  # 3 + 3 rounds
    assert all(len(p.earlier_ms) == len(p.rounds_ms) == 3 for p in res.plans)
    assert res.winner.baseline and res.fallback is not None
    assert "noisy again" in res.fallback and "TorchRec's plan, the safer plan" in res.fallback
    assert "measured again" in res.summary() and res.fallback in res.summary()
    # without TorchRec's plan, the safer plan is the fastest heuristic's
    agent, task, chosen, _, timing = scripted(swinging, [5.0])
    options = cal.VerifyOptions(incumbent="chosen")
    extra = {"chosen": chosen}
    res = cal.verify(agent, task, 2, FAST, options, extra=extra, timing=timing.timing())
    assert res.winner.heuristic and res.fallback is not None


def test_on_a_noisy_machine_a_plan_that_won_every_round_of_both_passes_is_kept():
    """FAKE timing: every plan swings by 60% in step (the load hits each round as a
    whole), and the chosen plan is faster than TorchRec's in all six pairings."""
    base = {"chosen": 8.0, "torchrec": 10.0, "other": 12.0}
    agent, task, chosen, torchrec, timing = scripted(
        lambda k, n: base[k] * (1.6 if n % 2 else 1.0), [5.0]
    )
    res = run(agent, task, chosen, torchrec, timing)
    assert [p.noisy for p in res.passes] == [True, True]
    assert res.winner.placement == chosen
    assert "faster than TorchRec's plan beyond the noise over every pass" in res.fallback
    assert "(in 6 of 6 rounds; median 10.40 ms against 13.00 ms)" in res.fallback


def test_on_a_noisy_machine_both_passes_decide_together():
    """FAKE timing: the load swings every plan by 60% from round to round, out of step.
    The chosen plan (8 ms quiet) beats TorchRec's (10 ms) in 5 of the 6 pairings of the
    two noisy passes: beyond the noise (sign test), so it is kept, not TorchRec's. Where
    the chosen plan won only 4 of 6, TorchRec's is kept."""
    base = {"chosen": 8.0, "torchrec": 10.0, "other": 12.0}

    def loaded(lost: set[int]):
        def step(kind: str, n: int) -> float:
            slow = (n in lost) if kind == "chosen" else (n % 2 == 0)
            return base[kind] * (1.6 if slow else 1.0)

        return step

    agent, task, chosen, torchrec, timing = scripted(loaded({1}), [5.0])
    res = run(agent, task, chosen, torchrec, timing)
    assert [p.noisy for p in res.passes] == [True, True]
    assert res.winner.placement == chosen
    assert "(in 5 of 6 rounds;" in res.fallback
    # its margin over TorchRec's plan is over all six rounds
    assert res.margins()["vs_torchrec"] == pytest.approx(8.0 / 13.0)
    agent, task, chosen, torchrec, timing = scripted(loaded({1, 3}), [5.0])
    res = run(agent, task, chosen, torchrec, timing)
    assert res.winner.baseline and "the safer plan" in res.fallback


def test_on_a_noisy_machine_another_plan_that_beat_torchrecs_is_kept():
    """FAKE timing: two noisy passes; the other candidates (the heuristics' plans and the
    policy's samples, 6 ms) beat TorchRec's (10 ms) in every pairing, the chosen plan in
    only half: the fastest plan that beat TorchRec's beyond the noise is kept, not
    TorchRec's slower one."""
    base = {"chosen": 8.0, "torchrec": 10.0, "other": 6.0}

    def step(kind: str, n: int) -> float:
        slow = n % 2 == (1 if kind == "chosen" else 0)
        return base[kind] * (1.6 if slow else 1.0)

    agent, task, chosen, torchrec, timing = scripted(step, [5.0])
    res = run(agent, task, chosen, torchrec, timing)
    assert [p.noisy for p in res.passes] == [True, True]
    assert res.winner.placement not in (chosen, torchrec)
    assert res.winner.measured_ms == pytest.approx(7.8)  # the median of 6, 9.6, 6, ...
    assert "(in 6 of 6 rounds; median 7.80 ms against 13.00 ms)" in res.fallback


def test_a_drifting_reference_kernel_is_measured_again_and_the_quiet_pass_decides():
    """FAKE timing: the reference kernel slows 40% during the first pass (the load
    changed), then stays put; the second pass is quiet and its rounds decide."""
    speed = {"chosen": 9.0, "torchrec": 10.0, "other": 12.0}
    agent, task, chosen, torchrec, timing = scripted(
        lambda k, n: speed[k] * (3.0 if n < 3 else 1.0), [5.0, 7.0, 7.0]
    )
    res = run(agent, task, chosen, torchrec, timing)
    first, second = res.passes
    assert first.noisy and first.drift == pytest.approx(0.4) and not second.noisy
    assert "reference kernel drifted +40%" in first.describe()
    assert res.fallback is None and res.winner.placement == chosen
    assert res.baseline.rounds_ms == [10.0] * 3  # the second pass's rounds, not the first's
    # no second pass allowed: the safer plan at once (the chosen plan lost a pairing)
    rounds = {"chosen": [9.0, 10.5, 9.0], "torchrec": [10.0] * 3, "other": [12.0] * 3}
    agent, task, chosen, torchrec, timing = scripted(lambda k, n: rounds[k][n], [5.0, 7.0])
    limits = cal.NoiseLimits(extra_rounds=0)
    res = run(agent, task, chosen, torchrec, timing, noise=limits)
    assert len(res.passes) == 1 and res.winner.baseline
    assert "noisy (" in res.fallback and "drifted +40%" in res.fallback


def test_the_cache_keeps_the_noise_and_the_fallback(tmp_path, monkeypatch):
    """FAKE timing: a noisy verification read back from the cache keeps its fallback."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    base = {"chosen": 8.0, "torchrec": 10.0, "other": 12.0}
    agent, task, chosen, torchrec, timing = scripted(
        lambda k, n: base[k] * (1.6 if n % 2 == (k == "torchrec") else 1.0), [5.0]
    )
    first = run(agent, task, chosen, torchrec, timing, cache=True)
    again = run(agent, task, chosen, torchrec, ScriptedTiming({}, _refuse, [1.0]), cache=True)
    assert again.cached and again.fallback == first.fallback
    assert again.winner.placement == first.winner.placement == torchrec
    assert [p.to_dict() for p in again.passes] == [p.to_dict() for p in first.passes]


def test_a_task_too_slow_to_measure_every_plan_measures_the_ones_that_matter():
    """FAKE timing on the timing's clock: 20 ms a measurement, a 0.1 s budget (0.3 s
    stretched), too little for 3 rounds of every plan. The verification measures fewer
    plans in whole rounds (at least 3: the planner's choice, TorchRec's and a heuristic's)
    rather than none; it says how many it left out. (No plan drops out: the rounds
    counted here are every plan's; dropping has tests of its own.)"""
    speed = {"chosen": 9.0, "torchrec": 10.0, "other": 12.0}
    agent, task, chosen, torchrec, timing = scripted(lambda k, n: speed[k], [5.0])
    step, clock = timing.step_ms, timing.clock

    def slow_step(task: Task, placement: list[int]) -> float:
        clock.advance(0.02)
        return step(task, placement)

    timing.step_ms = slow_step
    res = run(agent, task, chosen, torchrec, timing, budget_s=0.1, drop=False)
    measured = [p for p in res.plans if p.rounds_ms]
    assert 3 <= len(measured) < len(res.plans) and res.left_out == len(res.plans) - len(measured)
    assert {tuple(chosen), tuple(torchrec)} <= {tuple(p.placement) for p in measured}
    assert len({len(p.rounds_ms) for p in measured}) == 1
    assert res.winner.placement == chosen  # faster than TorchRec's in every round
    assert f"verified {len(measured)} of {len(res.plans)} plans" in res.summary()
    assert "predicted slower were not measured" in res.summary()
    assert any(p.heuristic for p in measured)  # the heuristic predicted fastest went third
    # on this clock, exactly: the probe's one measurement, then as many plans as 3 rounds
    # fit in 80% of the stretched budget (0.24 s // 0.06 s a plan), 3 rounds each
    assert len(measured) == 4 and {len(p.rounds_ms) for p in measured} == {3}
    assert res.seconds == pytest.approx(0.02 * (1 + 3 * 4))
    # the plans left out are "not measured": null in JSON (never NaN), and in the table
    from torchrec_dreamshard.io import dumps_strict, loads_strict

    written = loads_strict(dumps_strict(res.to_dict()))
    left = [p for p in written["plans"] if not p["measured"]]
    assert len(left) == res.left_out and all(p["measured_ms"] is None for p in left)
    assert written["not_measured"] == [p["name"] for p in left]
    assert sum("not measured" in line for line in res.lines()) == res.left_out


def test_measuring_priority():
    plans = [
        plan("heuristic:size_greedy", [], heuristic=True),
        plan("policy_sample1", []),
        plan("torchrec_ours", [], baseline=True),
        plan("chosen=heuristic:dim_greedy", [], heuristic=True),
    ]
    for p, ms in zip(plans, (3.0, 1.0, 9.0, 5.0), strict=True):
        p.predicted_ms = ms
    # the planner's choice, TorchRec's, the heuristic predicted fastest, then by prediction
    assert cal.measuring_priority(plans, "chosen") == [3, 2, 0, 1]
    plans.append(plan("heuristic:lookup_greedy", [], heuristic=True))
    plans[-1].predicted_ms = 2.0
    assert cal.measuring_priority(plans, "chosen") == [3, 2, 4, 1, 0]
    assert cal.measuring_priority(plans, None) == [2, 4, 1, 0, 3]


def _refuse(kind: str, n: int) -> float:
    raise AssertionError("measured again although this machine's cache holds the plans")


def plan(name, rounds, heuristic=False, baseline=False):
    return cal.VerifiedPlan(
        name, [0], 1.0, 0.0, rounds_ms=rounds, heuristic=heuristic, baseline=baseline
    )


def test_the_kept_plan_never_measured_slower_than_torchrecs():
    assert [sign_test_wins(n) for n in (1, 2, 3, 4, 5, 6, 7)] == [None, None, 3, 4, 5, 5, 6]
    torchrec = plan("torchrec_ours", [10.0, 10.0, 10.0], baseline=True)
    chosen = plan("chosen", [9.0, 10.5, 9.0])  # lower median, lost a round
    steady = plan("heuristic:size_greedy", [9.5, 9.9, 9.8], heuristic=True)  # every round
    assert cal.rank_measured([torchrec, chosen], incumbent="chosen")[0] is torchrec
    assert cal.rank_measured([torchrec, chosen, steady], incumbent="chosen")[0] is steady
    slower = plan("heuristic:dim_greedy", [11.0, 11.0, 11.0], heuristic=True)
    assert cal.rank_measured([slower, torchrec])[0] is torchrec  # the best heuristic gives way
    # over six rounds, five wins are beyond the noise
    six = plan("chosen", [9.0, 9.0, 11.0, 9.0, 9.0, 9.0])
    torchrec6 = plan("torchrec_ours", [10.0] * 6, baseline=True)
    assert cal.beats_beyond_noise(six, torchrec6)
    # faster than TorchRec's every round, but by less than the verdict's error on the job's
    # own ids at the median: TorchRec's plan stays
    close = plan("chosen", [9.95, 9.95, 9.96, 9.95, 9.95, 9.95])
    assert not cal.beats_beyond_noise(close, torchrec6)
    assert cal.rank_measured([torchrec6, close], incumbent="chosen")[0] is torchrec6
    assert cal.beats_beyond_noise(close, plan("heuristic:x", [10.0] * 6, heuristic=True))
    assert cal.rank_measured([torchrec6, six], incumbent="chosen")[0] is six
    # no whole round: nothing was measured, and the planner's choice stands (its predicted
    # margin over TorchRec's plan is reported instead)
    unmeasured = [plan("chosen", []), plan("torchrec_ours", [], baseline=True)]
    assert cal.rank_measured(unmeasured, incumbent="chosen")[0].name == "chosen"
    # under 3 rounds no sign test decides: faster by more than 5% in every round beats it
    one = plan("chosen", [9.0]), plan("torchrec_ours", [10.0], baseline=True)
    assert cal.beats_beyond_noise(*one)
    assert cal.rank_measured(list(one), incumbent="chosen")[0].name == "chosen"
    close = plan("chosen", [9.7, 9.6]), plan("torchrec_ours", [10.0, 10.0], baseline=True)
    assert not cal.beats_beyond_noise(*close)  # 3-4% is within a run-to-run move
    assert cal.rank_measured(list(close), incumbent="chosen")[0].baseline


def test_noise_of_rounds_and_reference():
    limits = cal.NoiseLimits()
    quiet = cal.Noise.of([{0: 10.0, 1: 20.0}, {0: 10.5, 1: 20.5}], (5.0, 5.2), limits)
    assert not quiet.noisy and quiet.spread == pytest.approx(0.0367, abs=1e-3)
    swings = cal.Noise.of([{0: 10.0}, {0: 14.0}, {0: 10.0}], (None, None), limits)
    assert swings.noisy and swings.drift is None
    one = cal.Noise.of([{0: 10.0}], (5.0, 5.0), limits)
    assert math.isnan(one.spread) and not one.noisy
    assert cal.Noise.from_dict(swings.to_dict()) == swings
    off = cal.NoiseLimits.off()
    assert not cal.Noise.of([{0: 1.0}, {0: 9.0}], (1.0, 9.0), off).noisy


def test_real_kernels_torchrecs_plan_is_measured_and_the_kept_plan_is_not_slower(
    tmp_path, monkeypatch
):
    """Real kernels, a tiny task: TorchRec's plan (handed in as a baseline source, as the
    planner does) is among the plans measured in the same rounds, and the kept plan did
    not measure slower than it (it beat it beyond the noise, or it is TorchRec's)."""
    from torchrec_dreamshard.planner.stages.candidates import TorchRecCandidate, default_sources
    from torchrec_dreamshard.verification.plan_ranking import pooled

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    agent, task = DreamShard.untrained(seed=0), tiny_task()
    out = cal.plan_task(
        agent,
        task,
        how=PlaceSettings(sources=default_sources()),
        verification=cal.VerificationSettings(2, FAST, cal.VerifyOptions(incumbent="chosen")),
    )
    ver = out.verification
    torchrec = TorchRecCandidate().propose(task)
    base = ver.baseline
    assert base is not None and base.placement == torchrec
    # every plan measured, TorchRec's among them, in the same rounds; a machine slow enough
    # to make this a slow task leaves some others out, and says how many; a plan clearly
    # behind after a round dropped out of the later ones (never TorchRec's)
    measured = [p for p in ver.plans if p.rounds_ms and p.dropped is None]
    assert {len(p.rounds_ms) for p in measured} == {len(base.rounds_ms)} and base.rounds_ms
    assert len(measured) + len(ver.dropped) + ver.left_out == len(ver.plans)
    assert base.dropped is None and ver.winner.dropped is None
    assert all(p.measured for p in ver.dropped)
    kept = ver.winner
    # where the rounds were noisy (a loaded machine), the rounds of every pass together
    # decide (plan_ranking.keep), not the last pass's alone
    judged = pooled if ver.fallback else (lambda p: p)
    assert kept is base or cal.beats_beyond_noise(judged(kept), judged(base))
    assert kept.measured_ms <= base.measured_ms
    assert out.placement == kept.placement
    assert any(line.startswith("verified ") for line in out.summary())


def test_where_nothing_is_measured_the_predicted_margins_are_given():
    """No verification: the outcome names the kept plan and its predicted margins over
    TorchRec's plan and the best heuristic's."""
    from torchrec_dreamshard.planner.stages.candidates import default_sources

    agent, task = DreamShard.untrained(seed=0), tiny_task()
    out = cal.plan_task(agent, task, how=PlaceSettings(sources=default_sources()))
    m = out.margins
    assert not m["measured"] and m["vs_torchrec"] > 0 and m["vs_best_heuristic"] > 0
    torchrec = default_sources()[0].propose(task)
    want = agent.predict(task, out.placement).step_ms / agent.predict(task, torchrec).step_ms
    assert m["vs_torchrec"] == pytest.approx(want)
    assert "TorchRec's" in m["line"] and "(not measured)" in m["line"]
    assert out.summary() == [m["line"]]
    # no baseline source: said so
    out = cal.plan_task(
        agent, task, how=PlaceSettings(sources=[FixedPlan("mine", tuple(torchrec))])
    )
    assert out.margins["vs_torchrec"] is None and "not planned here" in out.margins["line"]


def test_calibration_discards_kernels_measured_while_the_reference_drifted(monkeypatch):
    """FAKE reference-kernel timing: it reads 2 ms before the kernels are measured and
    3 ms after (+50%: the machine got busy). The kernels measured are discarded from the
    store, nothing is fitted on them, and the result says why; a calibration on a steady
    machine then measures them again."""
    from torchrec_dreamshard.measure import reference_speed

    readings = iter([(1.0, 1.0), (1.5, 1.5), (1.5, 1.5), (1.4, 1.4)])  # a change that lasts
    monkeypatch.setattr(
        reference_speed, "measure_reference_ms", lambda device="cpu": next(readings)
    )
    agent, task = DreamShard.untrained(seed=0), tiny_task()
    config = cal.CalibrationConfig(measure=FAST, max_groups=2, progress=False, epochs=20)
    res = cal.calibrate(agent, task, config)
    assert res.discarded > 0 and res.measured == 0 and res.samples == 0
    assert res.drift == pytest.approx(0.5)
    assert "drifted +50%" in res.note and "discarded" in res.note
    after, before = res.agent.predict(task, [0] * 6), agent.predict(task, [0] * 6)
    assert after.fwd_ms + after.bwd_ms == pytest.approx(before.fwd_ms + before.bwd_ms)  # unlearned
    assert any(res.note in line for line in res.lines())
    steady = iter([(1.0, 1.0), (1.05, 1.05)])
    monkeypatch.setattr(reference_speed, "measure_reference_ms", lambda device="cpu": next(steady))
    again = cal.calibrate(agent, task, config)
    assert again.discarded == 0 and again.measured == res.discarded and again.samples > 0


def test_a_blip_of_the_reference_kernel_discards_nothing(monkeypatch):
    """FAKE reference-kernel timing: +50% once after the kernels were measured, then back
    to where it was: timed twice more, the median of the three is within the limit, so
    the kernels measured are kept."""
    from torchrec_dreamshard.measure import reference_speed

    readings = iter([(1.0, 1.0), (1.5, 1.5), (1.0, 1.0), (1.02, 1.02)])
    monkeypatch.setattr(
        reference_speed, "measure_reference_ms", lambda device="cpu": next(readings)
    )
    agent, task = DreamShard.untrained(seed=0), tiny_task()
    config = cal.CalibrationConfig(measure=FAST, max_groups=2, progress=False, epochs=20)
    res = cal.calibrate(agent, task, config)
    assert res.discarded == 0 and res.measured > 0 and res.samples > 0
    assert res.drift == pytest.approx(0.02)
