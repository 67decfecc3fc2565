"""The safety net: memory-aware greedy, penalised scoring, refinement, the report."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchrec_dreamshard.cost import cost_net as M
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task, check_placement
from torchrec_dreamshard.policy import moves as neighbourhood
from torchrec_dreamshard.policy import safety_net as S
from torchrec_dreamshard.policy.heuristics import NoPlanError, greedy_by_costs


def _scorer(task: Task, penalty: float = 1.0, seed: int = 0) -> S.Scorer:
    torch.manual_seed(seed)
    net = M.CostNet(hidden=8, members=3)
    enc = net.encode(torch.from_numpy(M.cost_inputs(task.tables, task.batch_size)))
    ctx = M.device_context(task.num_devices, sum(t.dim for t in task.tables))
    return S.Scorer(net, task, enc, ctx, penalty)


def _task(n=12, D=3, factor=1.5, seed=0) -> Task:
    rng = np.random.default_rng(seed)
    tables = [
        TableSpec(
            name=f"t{i}",
            rows=int(rng.integers(1000, 100_000)),
            dim=int(rng.choice([8, 32, 64])),
            pooling_factor=float(rng.uniform(1, 30)),
        )
        for i in range(n)
    ]
    total = sum(t.size_bytes for t in tables)
    cap = int(max(factor * total / D, 1.05 * max(t.size_bytes for t in tables)))
    return Task(tables=tables, num_devices=D, memory_bytes=cap, batch_size=2048)


def test_memory_aware_greedy_fits_where_plain_greedy_strands_a_big_table():
    # two devices of 8 units; costs put the small tables first, so plain greedy
    # spreads them and leaves no room for the 6-unit table
    unit = 1000 * 4
    sizes = [3, 3, 2, 6]
    tables = [
        TableSpec(name=f"t{i}", rows=s * 1000, dim=1, pooling_factor=1.0)
        for i, s in enumerate(sizes)
    ]
    task = Task(tables=tables, num_devices=2, memory_bytes=8 * unit, batch_size=64)
    costs = [4.0, 3.0, 2.0, 1.0]
    with pytest.raises(NoPlanError):
        greedy_by_costs(task, costs)
    placement = S.memory_aware_greedy(task, costs)
    assert placement is not None
    used = np.bincount(placement, weights=[t.size_bytes for t in tables], minlength=2)
    assert np.all(used <= task.memory)


def test_refine_never_raises_the_score_and_keeps_memory():
    task = _task(16, 4, factor=1.3)
    scorer = _scorer(task)
    p = S.memory_aware_greedy(task, [1.0] * len(task.tables))
    cand = scorer.candidates({"start": np.asarray(p)})[0]
    better = S.refine(scorer, cand, 20)
    assert better.score <= cand.score + 1e-9
    used = np.bincount(better.placement, weights=[t.size_bytes for t in task.tables], minlength=4)
    assert np.all(used <= np.asarray(task.memory))
    # the refined candidate's score is what a fresh scoring of its placement says
    again = scorer.candidates({"x": better.placement})[0]
    assert again.score == pytest.approx(better.score, abs=1e-5)
    # its provenance is fields: the source's name, and whether moves changed its plan
    assert better.name == "start" and not cand.refined
    assert better.refined == (better.score < cand.score)
    assert better.label == ("start+refined" if better.refined else "start")


def test_choose_picks_the_lowest_penalised_score_and_reports_margins():
    task = _task(14, 3)
    scorer = _scorer(task, penalty=2.0)
    plans, failed = S.heuristic_candidates(task, np.ones(len(task.tables)))
    report = S.choose(scorer, plans, failed, refine_top=0)
    scores = [c.score for c in report.candidates]
    assert scores == sorted(scores)
    fresh = scorer.candidates(plans)
    assert report.winner.score == pytest.approx(min(c.score for c in fresh), abs=1e-6)
    assert all(c.score >= c.log_step - 1e-9 for c in report.candidates)  # penalty >= 0
    assert report.margin(report.winner.name) == pytest.approx(1.0)
    assert any("winner" in line for line in report.lines())


def _members_log_steps(scorer: S.Scorer, placement) -> np.ndarray:
    """Each ensemble member's log step cost of ``placement``, computed here one device at a
    time: the device's state is the sum of its tables' encodings, the member's log device
    time the log of its summed fwd + bwd + comm, the step the slowest occupied device's."""
    steps = []
    for d in range(scorer.task.num_devices):
        on_d = [i for i, dev in enumerate(placement) if dev == d]
        if not on_d:
            continue
        state = scorer.enc[on_d].sum(0)
        member = scorer.net.member_device_log_costs(state, scorer.ctx)  # [K, 3]
        steps.append(torch.log(torch.exp(member).sum(-1)).numpy())
    return np.max(steps, axis=0)


def test_penalty_prefers_the_plan_the_members_agree_on():
    """On every placement of ten tables on two devices that fits, the scorer's spread is
    the members' standard deviation of their own log step costs, computed here; with no
    penalty the best plan is not the one the members agree on most, and a heavy penalty
    picks exactly that one."""
    import itertools

    task = _task(10, 2)
    scorer = _scorer(task, penalty=0.0)
    sizes = np.array([t.size_bytes for t in task.tables])
    every = np.array(list(itertools.product([0, 1], repeat=len(task.tables))))
    fits = every[[np.all(np.bincount(p, sizes, 2) <= task.memory) for p in every]]
    plans = {str(k): p for k, p in enumerate(fits)}
    with torch.no_grad():
        spread = {n: float(np.std(_members_log_steps(scorer, p), ddof=1)) for n, p in plans.items()}
    plain = {c.name: c for c in scorer.candidates(plans)}
    for n, c in plain.items():
        assert c.log_std == pytest.approx(spread[n], abs=1e-5)
    lowest = min(spread.values())  # a plan and its mirror image (devices swapped) tie
    assert spread[min(plain.values(), key=lambda c: c.score).name] > lowest + 1e-3
    scorer.penalty = 1e4
    heavy = min(scorer.candidates(plans), key=lambda c: c.score)
    assert spread[heavy.name] == pytest.approx(lowest, abs=1e-6)


def test_two_devices_at_tight_memory_come_close_to_the_exhaustive_optimum():
    """On a two-device task at 1.2x memory, the safe plan is within 2% (by the cost
    network's own penalised score) of the best of all 2^T placements that fit."""
    import itertools

    from torchrec_dreamshard.policy import DreamShard

    agent = DreamShard.untrained(seed=7)
    for seed in range(3):
        task = _task(11, 2, factor=1.2, seed=seed)
        sizes = np.array([t.size_bytes for t in task.tables])
        every = np.array(list(itertools.product([0, 1], repeat=len(sizes))))
        used = np.stack([(every == d) @ sizes for d in range(2)], axis=1)
        legal = every[np.all(used <= np.asarray(task.memory), axis=1)]
        scorer = agent.scorer(task)
        best = min(c.score for c in scorer.candidates({str(k): p for k, p in enumerate(legal)}))
        placement = agent.place(task)
        got = scorer.candidates({"safe": np.asarray(placement)})[0].score
        assert got <= best + np.log(1.02)


def test_agent_candidates_are_what_the_safe_mode_chooses_among():
    from torchrec_dreamshard.policy import DreamShard, FixedPlan

    task = _task()
    mine = FixedPlan("mine", tuple(greedy_by_costs(task, [t.dim for t in task.tables])))
    agent = DreamShard.untrained(seed=0, sources=[mine])
    safe, failed = agent.candidates(task, "safe", num_samples=2, seed=1)
    assert {"policy_greedy", "policy_sample0", "policy_sample1", "memory_aware_size"} <= set(safe)
    assert "memory_aware_predicted" in safe and "mine" in safe and not failed
    search, _ = agent.candidates(task, "search", num_samples=2, seed=1)
    assert set(search) == {"policy_greedy", "policy_sample0", "policy_sample1"}
    for p in safe.values():
        check_placement(task, list(p))  # raises on a wrong length or an overfull device
    agent.place(task, num_samples=2, seed=1)
    sources = {c.name for c in agent.last_report.candidates}
    assert sources <= set(safe)  # every rated plan came from a candidate (refined or not)
    with pytest.raises(ValueError, match="safe or search"):
        agent.candidates(task, "greedy")


@pytest.mark.parametrize("fast", [True, False])
def test_score_changes_scores_the_changed_placements_as_score_states_does(fast, monkeypatch):
    """Refinement rates its moves from the two devices each changes (``score_changes``):
    the same scores as rating the whole batch of changed device states, both where the
    unchanged devices' totals are reused and where every device is reduced again.

    The same up to float32 rounding, not bit for bit: the two run the cost network's heads
    on batches of other shapes, and MKL blocks (and sums) another shape otherwise on some
    CPUs (2e-7 apart, relative 8e-8, on an AMD EPYC)."""
    from torchrec_dreamshard.data.sampler import TaskSampler
    from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool
    from torchrec_dreamshard.policy import DreamShard

    sampler = TaskSampler(synthetic_pool(60, scale=CPU_POOL_SCALE), seed=2)
    task = sampler.sample("test", 24, 5, memory_factor=1.4)
    agent = DreamShard.untrained(seed=1)
    scorer = agent.scorer(task)
    placement = np.asarray(agent.place(task, "greedy"))
    state, occ = scorer.device_states(placement[None])
    sizes = np.array([t.size_bytes for t in task.tables], dtype=np.float64)
    b = int(np.bincount(placement, minlength=5).argmax())
    rng = np.random.default_rng(0)
    moves = neighbourhood.moves(placement, b, sizes, np.asarray(task.memory, dtype=np.float64), rng)
    alone = int((placement == b).sum()) == 1
    changes = neighbourhood.Changes.of_moves(moves, b, state, scorer.enc, alone)
    want = scorer.score_states(*_moved_states(state, occ, changes))
    if not fast:
        monkeypatch.setattr(S.torch, "equal", lambda x, y: False)
    got = scorer.score_changes(state, occ, changes)
    monkeypatch.undo()
    for g, w in zip(got, want, strict=True):
        # log-cost scores of order 1: a few float32 ulps of rounding, no more (a wrong
        # device's cost would move them by 1e-3 or more)
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def _moved_states(state, occ, changes):
    """Every device's state and occupancy after each change, as one batch."""
    C = len(changes.devices)
    rows = torch.arange(C).unsqueeze(-1)
    states = state.expand(C, -1, -1).clone()
    states[rows, changes.devices] = changes.states
    occupied = occ.expand(C, -1).clone()
    occupied[rows, changes.devices] = changes.occupied
    return states, occupied
