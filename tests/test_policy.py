"""The estimated MDP and the agent's placements: memory, errors, any T and D."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchrec_dreamshard.data.sampler import TaskSampler, make_task
from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task, check_placement, device_bytes
from torchrec_dreamshard.policy import DreamShard, PlacementError
from torchrec_dreamshard.policy.mdp import _Devices
from torchrec_dreamshard.threads import single_thread


@pytest.fixture(scope="module")
def sampler():
    return TaskSampler(synthetic_pool(300, scale=CPU_POOL_SCALE), seed=2)


@pytest.fixture(scope="module")
def agent():
    return DreamShard.untrained(seed=5)


@pytest.mark.parametrize("factor", [1.02, 1.1, 1.5])
@pytest.mark.parametrize("devices", [2, 4, 8])
def test_never_picks_a_device_without_room(sampler, agent, factor, devices):
    task = sampler.sample("test", 30, devices, memory_factor=factor)
    for mode in ("greedy", "search"):
        placement = agent.place(task, mode=mode, num_samples=8)
        check_placement(task, placement)  # raises if a device is over its memory
    mdp = agent.mdp(task)
    with single_thread():  # tiny matrices: threads only cost time (see threads.py)
        gen = torch.Generator().manual_seed(0)
        roll = mdp.rollout(agent.policy, 16, greedy=False, generator=gen)
    for row in roll.placements:
        used = device_bytes(task, row.tolist())
        assert all(u <= m for u, m in zip(used, task.memory, strict=True))


@single_thread()
def test_recorded_actions_are_legal(sampler, agent):
    task = sampler.sample("train", 20, 4, memory_factor=1.05)
    roll = agent.mdp(task).rollout(agent.policy, 8, greedy=False, record=True)
    chosen = roll.legal.gather(-1, roll.actions.unsqueeze(-1))
    assert bool(chosen.all())


def test_placement_error_names_the_table():
    tables = [TableSpec(name=f"big{i}", rows=15, dim=1, pooling_factor=1.0) for i in range(3)]
    task = Task(tables=tables, num_devices=2, memory_bytes=100, batch_size=64)  # 60 B each
    with pytest.raises(PlacementError, match="big"):
        DreamShard.untrained().place(task)


@pytest.mark.parametrize(("num_tables", "devices"), [(1, 1), (1, 8), (5, 1), (120, 16)])
def test_any_number_of_tables_and_devices(sampler, agent, num_tables, devices):
    tables = sampler.splits["test"][:num_tables]
    task = make_task(tables, devices, 2048, memory_factor=2.0)
    placement = agent.place(task)
    assert len(placement) == num_tables
    assert set(placement) <= set(range(devices))
    pred = agent.predict(task, placement)
    assert len(pred.fwd_ms) == devices and pred.step_ms > 0
    assert agent.table_costs(task).shape == (num_tables,)


def test_search_beats_a_poor_greedy_roll_out(sampler):
    """With a policy that rates every device alike, the greedy roll-out puts each table on
    the first device with room; search mode's sampled roll-outs and refinement must find
    a placement the cost network rates clearly better."""
    from torchrec_dreamshard.policy import PolicyNet

    class Indifferent(PolicyNet):
        def forward(self, u: torch.Tensor) -> torch.Tensor:
            return torch.zeros(u.shape[:-1])  # the same logit for every device

    agent = DreamShard.untrained(seed=5)
    agent.policy = Indifferent(agent.cost_net.enc_dim).eval()
    task = sampler.sample("test", 40, 4, memory_factor=3.0)
    greedy = agent.place(task, "greedy")
    assert len(set(greedy)) < 4  # first fit leaves devices empty
    search = agent.place(task, "search", num_samples=16, seed=1)
    assert agent.predict(task, search).step_ms < 0.8 * agent.predict(task, greedy).step_ms


def test_place_is_deterministic(sampler, agent):
    task = sampler.sample("test", 25, 4)
    assert agent.place(task, "search", seed=3) == agent.place(task, "search", seed=3)


def test_bad_arguments(sampler, agent):
    task = sampler.sample("test", 10, 2)
    with pytest.raises(ValueError, match="mode"):
        agent.place(task, mode="beam")
    with pytest.raises(ValueError, match="num_samples"):
        agent.place(task, mode="search", num_samples=-1)


def test_costs_grow_with_the_batch(sampler, agent):
    """The batch enters the cost network through the physical quantities (lookups, bags,
    unique rows), not a linear rescaling: a bigger batch never costs less."""
    small = sampler.sample("test", 10, 2, batch_size=1024, rng=np.random.default_rng(3))
    big = type(small)(
        tables=small.tables, num_devices=2, memory_bytes=small.memory, batch_size=8192
    )
    assert np.all(agent.table_costs(big) > agent.table_costs(small))


def test_table_costs_order_the_mdp(sampler, agent):
    """The MDP places tables by descending single-table cost, each cost computed here
    through ``predict`` (the table alone on device 0, the others elsewhere)."""
    task = sampler.sample("test", 12, 4, memory_factor=4.0)
    alone = []
    for i in range(len(task.tables)):
        placement = [1 + j % 3 for j in range(len(task.tables))]
        placement[i] = 0
        pred = agent.predict(task, placement)
        alone.append(pred.fwd_ms[0] + pred.bwd_ms[0] + pred.comm_ms[0])
    order = agent.mdp(task).order
    assert np.all(np.diff(np.asarray(alone)[order]) <= 1e-6 * max(alone))
    np.testing.assert_allclose(agent.table_costs(task), alone, rtol=1e-5)


def test_refine_never_raises_the_penalised_cost_and_keeps_memory(sampler, agent):
    from torchrec_dreamshard.policy import refine

    task = sampler.sample("test", 30, 4, memory_factor=1.1)
    scorer = agent.scorer(task)
    start = scorer.candidates({"greedy": np.asarray(agent.place(task, "greedy"))})[0]
    better = refine(scorer, start, 32)
    check_placement(task, better.placement.tolist())
    assert better.score <= start.score + 1e-6


def _mdp_state(mdp, agent, i: int, K: int, seed: int):
    """A random state before step ``i``: tables ``0..i-1`` (MDP order) on random devices."""
    rng = np.random.default_rng(seed)
    D, H = mdp.D, agent.cost_net.enc_dim
    S = torch.zeros(K, D, H)
    occupied = torch.zeros(K, D, dtype=torch.bool)
    for k in range(K):
        for j in range(i):
            d = int(rng.integers(D))
            S[k, d] += mdp.enc[j]
            occupied[k, d] = True
    return S, occupied


@pytest.mark.parametrize("devices", [1, 2, 5])
@single_thread()
def test_cand_step_shortcut_matches_a_full_recompute(sampler, agent, devices):
    task = sampler.sample("test", 12, devices, memory_factor=4.0)
    mdp, net = agent.mdp(task), agent.cost_net
    for i in (1, 3, 8):
        S, occupied = _mdp_state(mdp, agent, i, K=4, seed=i)
        with torch.no_grad():
            log_dev = net.device_log_costs(S, mdp.ctx)
            log_tot = torch.logsumexp(log_dev, -1).numpy()
            free = np.tile(mdp.capacity, (4, 1))
            z = np.where(occupied.numpy(), log_tot, np.float32(-1e30))
            state = _Devices(
                S.numpy(), log_dev.numpy(), log_tot, z, occupied.numpy(), free, free.sum(1), True
            )
            cand_S = S + mdp.enc[i]
            cand_tot = torch.logsumexp(net.device_log_costs(cand_S, mdp.ctx), -1)
            fast = torch.from_numpy(mdp._cand_step(state, cand_tot.numpy()))
            for d in range(devices):
                S_d, occ_d = S.clone(), occupied.clone()
                S_d[:, d], occ_d[:, d] = cand_S[:, d], True
                full = net.overall_log_cost(S_d, net.device_log_costs(S_d, mdp.ctx), occ_d)
                torch.testing.assert_close(fast[:, d], full, rtol=1e-5, atol=1e-5)


def test_ffd_fits():
    from torchrec_dreamshard.policy.packing import ffd_fits

    assert ffd_fits(np.array([5.0, 5.0]), np.array([5.0, 5.0]))
    assert ffd_fits(np.array([2.0, 6.0, 3.0]), np.array([6.0, 5.0]))  # 6 | 3 + 2
    assert not ffd_fits(np.array([4.0, 4.0, 4.0]), np.array([6.0, 6.0]))
    assert not ffd_fits(np.array([7.0]), np.array([6.0, 6.0]))
    assert ffd_fits(np.array([]), np.array([1.0]))


def test_quick_feasible_is_a_sound_bound(sampler, agent):
    """Where the quick bound says the rest can be packed, first-fit decreasing packs it;
    on a tight task it must refuse some choices that really are infeasible."""
    from torchrec_dreamshard.policy.packing import ffd_fits

    rng = np.random.default_rng(0)
    refused = 0
    for factor in (1.02, 1.1, 1.5):
        task = sampler.sample("test", 20, 3, memory_factor=factor)
        mdp = agent.mdp(task)
        for i in range(len(mdp.sizes)):
            free = np.tile(mdp.capacity, (6, 1)) - rng.uniform(0, 0.5, (6, 3)) * mdp.capacity
            free[:, 0] = np.maximum(free[:, 0], mdp.sizes[i])  # device 0 always has room
            a = np.array([rng.choice(np.flatnonzero(row >= mdp.sizes[i])) for row in free])
            quick = mdp.quick_feasible(i, free, a)
            for k in range(6):
                trial = free[k].copy()
                trial[a[k]] -= mdp.sizes[i]
                packs = ffd_fits(mdp.sizes[i + 1 :], trial)
                assert packs or not quick[k]
                refused += int(not quick[k] and not packs)
    assert refused > 0


def test_can_pack_never_claims_a_packing_that_does_not_exist():
    """``can_pack``'s quick bounds (the O(D) one and the any-fit one) never claim a packing
    that does not exist: whenever it says yes, a brute-force search of these small cases
    finds an assignment of the rest that fits."""
    import itertools

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from torchrec_dreamshard.policy.packing import can_pack

    sizes = st.lists(st.integers(1, 20), min_size=0, max_size=5)
    frees = st.lists(st.integers(0, 40), min_size=1, max_size=3)

    @settings(max_examples=300, deadline=None)
    @given(sizes, frees, st.integers(0, 2), st.integers(0, 20))
    def check(rest, free, d, size):
        free = np.array(free, dtype=np.float64)
        d = d % len(free)
        rest = np.sort(np.array(rest, dtype=np.float64))[::-1]
        if free[d] < size or not can_pack(rest, free, d, float(size)):
            return  # it is asked only of devices with room for the table
        trial = free.copy()
        trial[d] -= size
        fits = any(
            all(
                sum(rest[j] for j in range(len(rest)) if where[j] == k) <= trial[k]
                for k in range(len(trial))
            )
            for where in itertools.product(range(len(trial)), repeat=len(rest))
        )
        assert fits, (rest, free, d, size)

    check()


def test_packing_check_chooses_as_can_pack_does():
    """``PackingCheck`` (the any-fit bound for every device at once, then ``can_pack``)
    picks the device the plain loop of ``can_pack`` over the devices picks, and where it
    says the rest surely packs, ``can_pack`` agrees for every device with room."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from torchrec_dreamshard.policy.packing import PackingCheck, can_pack

    @settings(max_examples=300, deadline=None)
    @given(
        st.lists(st.integers(1, 30), min_size=1, max_size=7),
        st.lists(st.integers(0, 60), min_size=1, max_size=4),
        st.integers(0, 6),
        st.randoms(use_true_random=False),
    )
    def check(sizes, free, n, rnd):
        sizes = np.array(sizes, dtype=np.float64)
        free = np.array(free, dtype=np.float64)
        n = n % len(sizes)
        devices = np.array(rnd.sample(range(len(free)), len(free)))
        rest = np.sort(sizes[n + 1 :])[::-1]
        packs = [d for d in devices if can_pack(rest, free, int(d), sizes[n])]
        want = int(packs[0]) if packs else int(devices[0])
        check = PackingCheck(sizes, free)
        assert check.first_packable(n, free, devices) == want
        if check.surely_packable(n, float(free.sum())):
            roomy = [d for d in devices if free[d] >= sizes[n]]
            assert all(can_pack(rest, free, int(d), sizes[n]) for d in roomy)

    check()


def test_frozen_policy_gives_the_policys_logits(agent):
    from torchrec_dreamshard.policy.policy_net import FrozenPolicy

    u = torch.rand(4, 9, agent.policy.in_dim + 12) * 3
    frozen = FrozenPolicy(agent.policy)
    with torch.no_grad():
        want = agent.policy(u)
        # the frozen copy folds its weights once and the numpy path multiplies in numpy:
        # other float32 operation orders, equal up to a few ulps of rounding
        torch.testing.assert_close(frozen(u), want, rtol=1e-5, atol=1e-5)
        scalars = u[..., agent.policy.in_dim :].numpy()
        np.testing.assert_allclose(
            frozen.numpy_logits(u, scalars), want.numpy(), rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("devices,memory_factor", [(1, 4.0), (3, 1.05), (8, 2.0)])
def test_rollout_inputs_are_the_cost_networks_view_of_each_step(
    sampler, agent, devices, memory_factor
):
    """Every recorded policy input is what the cost network says of that step's state,
    recomputed from scratch (the roll-out keeps its state incrementally), up to float32
    rounding (the two evaluate the network on batches of other shapes, which MKL may sum
    in another order), and the actions are the greedy choices among the recorded legal
    devices."""
    task = sampler.sample("test", 14, devices, memory_factor=memory_factor)
    mdp, net = agent.mdp(task), agent.cost_net
    roll = mdp.rollout(agent.policy, 1, greedy=True, record=True)
    S = torch.zeros(1, devices, net.enc_dim)
    occupied = torch.zeros(1, devices, dtype=torch.bool)
    free = mdp.capacity.copy()
    with torch.no_grad():
        for i, a in enumerate(roll.actions[:, 0].tolist()):
            want = _reference_inputs(mdp, i, S, occupied, free)
            torch.testing.assert_close(roll.inputs[i], want, rtol=1e-5, atol=1e-5)
            logits = agent.policy(roll.inputs[i]).masked_fill(~roll.legal[i], float("-inf"))
            assert a == int(logits.argmax(-1)[0])
            S[0, a] += mdp.enc[i]
            occupied[0, a] = True
            free[a] -= mdp.sizes[i]


def _reference_inputs(mdp, i, S, occupied, free) -> torch.Tensor:
    """The policy inputs of step ``i`` as the module docstring of the policy defines
    them, from the network's own methods (the roll-out's pre-incremental arithmetic)."""
    net, log_eps = mdp.net, float(np.log(1e-3))
    log_dev = net.device_log_costs(S, mdp.ctx).masked_fill(~occupied.unsqueeze(-1), log_eps)
    cand_S = S + mdp.enc[i]
    cand_dev = net.device_log_costs(cand_S, mdp.ctx)
    now_tot = torch.logsumexp(log_dev, -1).masked_fill(~occupied, log_eps)
    cand_tot = torch.logsumexp(cand_dev, -1)
    any_occ = bool(occupied.any())
    step = net.overall_log_cost(S, log_dev, occupied) if any_occ else torch.tensor([log_eps])
    ref = step.unsqueeze(-1)
    cand_step = torch.stack(
        [
            net.overall_log_cost(S_d, net.device_log_costs(S_d, mdp.ctx), occ_d)
            for S_d, occ_d in _with_table(S, cand_S, occupied)
        ],
        dim=-1,
    )
    cap = torch.from_numpy(mdp.capacity).float()
    used = 1.0 - torch.from_numpy(free[None]).float() / cap
    after = used + float(mdp.sizes[i]) / cap
    scalars = [
        cand_step - ref,
        cand_tot - ref,
        (now_tot - ref).clamp(min=-10.0),
        torch.maximum(cand_tot, ref) - ref,
        occupied.float(),
        used,
        after.clamp(max=2.0),
        cand_dev[..., 0] - ref,
        cand_dev[..., 1] - ref,
        cand_dev[..., 2] - ref,
        torch.full_like(used, (i + 1) / len(mdp.order)),
        torch.full_like(used, float(mdp.ctx[0])),
    ]
    return torch.cat([torch.log1p(cand_S), torch.stack(scalars, dim=-1)], dim=-1)


def _with_table(S, cand_S, occupied):
    """Each device's state with table ``i`` added there, the others as they are."""
    for d in range(S.shape[1]):
        S_d, occ_d = S.clone(), occupied.clone()
        S_d[:, d], occ_d[:, d] = cand_S[:, d], True
        yield S_d, occ_d
