"""The safety net: several candidate plans, each refined, the winner chosen by the cost
model penalised by its own uncertainty.

A learned policy alone can fail on tables unlike its training tables, and a search
against a learned cost model finds that model's errors. So the default plan is chosen
among candidates from different sources:

* the policy's greedy roll-out and a few sampled roll-outs;
* the classic heuristics' proxies (size, dim, lookup and size-lookup) and the cost model's
  *single-table* predictions, each balanced greedily with a memory look-ahead
  (:func:`memory_aware_greedy`), so that tight memory does not strand a big table; they
  are named ``memory_aware_<proxy>`` (``memory_aware_size``, ..., ``memory_aware_predicted``)
  to tell them from the heuristics without the look-ahead (``size_greedy``, ... in
  :mod:`torchrec_dreamshard.policy.heuristics`);
* the plans of the candidate sources the caller brings (TorchRec's own planner, for one:
  see :mod:`torchrec_dreamshard.policy.protocol`).

Each is rated ``score = log step + penalty * std_k log step_k``: the ensemble's predicted
log step cost plus the spread of its members ``k`` over their own predictions, so a plan
only some members believe in is not chosen.
The best few are improved by moves and swaps off the predicted bottleneck device that
lower the same score (:func:`refine`), and the lowest score wins. :class:`SafetyReport`
says which candidate won and by how much.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from torchrec_dreamshard.cost.cost_net import FrozenHeads
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.policy.heuristics import PROXIES
from torchrec_dreamshard.policy.moves import REFINE_CANDIDATES, Changes
from torchrec_dreamshard.policy.moves import moves as neighbour_moves
from torchrec_dreamshard.policy.packing import PackingCheck

DEFAULT_PENALTY = 1.0  # std of the members' log step added to their mean
DEFAULT_SAMPLES = 4  # sampled policy roll-outs
REFINE_TOP = 3  # candidates refined
REFINE_STEPS = 48  # improving moves/swaps per refined candidate, at most


# ----------------------------------------------------------------------------------------
# Memory-aware greedy
# ----------------------------------------------------------------------------------------


def memory_aware_greedy(task: Task, costs: Sequence[float]) -> list[int] | None:
    """Tables by ``costs`` descending, each to the least-loaded device (by the sum of its
    tables' costs) with room **from which the remaining tables can still be packed**
    (an any-fit bound, else first-fit decreasing); ``None`` if no order of that kind fits.
    """
    sizes = np.array([t.size_bytes for t in task.tables], dtype=np.float64)
    order = sorted(range(len(sizes)), key=lambda i: (-costs[i], i))
    free = np.asarray(task.memory, dtype=np.float64).copy()
    packing = PackingCheck(sizes[order], free)
    free_total = float(free.sum())
    finite = bool(np.isfinite(np.asarray(costs, dtype=np.float64)).all())
    load = np.zeros(task.num_devices)
    out = [0] * len(sizes)
    for n, i in enumerate(order):
        room = np.flatnonzero(free >= sizes[i])
        if room.size == 0:
            return None
        if finite and packing.surely_packable(n, free_total):
            d = int(room[np.argmin(load[room])])  # the first by load, as the sort below
        else:
            d = packing.first_packable(n, free, room[np.argsort(load[room], kind="stable")])
        out[i] = d
        free[d] -= sizes[i]
        free_total -= sizes[i]
        load[d] += costs[i]
    return out


# ----------------------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------------------


@dataclass
class Candidate:
    """One candidate plan and the cost model's view of it.

    Attributes:
        name: the source that proposed it (``policy_greedy``, ``memory_aware_size``, a
            candidate source's name, ...).
        placement: device per table.
        score: ``log_step + penalty * log_std``.
        log_step: the ensemble's log step cost (as :meth:`DreamShard.predict` gives it).
        log_std: the members' standard deviation of their own log step cost.
        refined: whether :func:`refine`'s moves changed the source's plan.
    """

    name: str
    placement: np.ndarray
    score: float
    log_step: float
    log_std: float
    refined: bool = False

    @property
    def step_ms(self) -> float:
        return float(math.exp(self.log_step))

    @property
    def label(self) -> str:
        """The name for people: ``name``, with ``+refined`` when refinement changed it."""
        return f"{self.name}+refined" if self.refined else self.name


@dataclass
class SafetyReport:
    """Which candidate won and by how much (candidates sorted by score)."""

    candidates: list[Candidate] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def winner(self) -> Candidate:
        return self.candidates[0]

    def margin(self, name: str) -> float:
        """Predicted step of the candidate from source ``name`` over the winner's (``nan``
        if absent)."""
        for c in self.candidates:
            if c.name == name:
                return float(math.exp(c.log_step - self.winner.log_step))
        return float("nan")

    def to_dict(self) -> dict:
        """The report as plain JSON: the winner and every candidate's predicted step,
        ratio to the winner and ensemble spread."""
        w = self.winner
        return {
            "winner": w.label,
            "candidates": [
                {
                    "name": c.label,
                    "source": c.name,
                    "refined": c.refined,
                    "predicted_ms": c.step_ms,
                    "vs_winner": float(math.exp(c.log_step - w.log_step)),
                    "log_std": c.log_std,
                }
                for c in self.candidates
            ],
            "no_plan": dict(self.failed),
        }

    def lines(self) -> list[str]:
        w = self.winner
        out = [
            f"safety net: {len(self.candidates)} candidates; winner {w.label} "
            f"({w.step_ms:.3f} ms predicted, log-std {w.log_std:.3f})"
        ]
        for c in self.candidates[1:]:
            out.append(
                f"  {c.label:28s} {c.step_ms:9.3f} ms  x{math.exp(c.log_step - w.log_step):.3f}"
                f"  log-std {c.log_std:.3f}"
            )
        out += [f"  {n:28s} no plan: {msg}" for n, msg in self.failed.items()]
        return out


class Scorer:
    """Scores placements of one task with the ensemble (penalised log step cost)."""

    def __init__(self, net, task: Task, enc: torch.Tensor, ctx: torch.Tensor, penalty: float):
        self.net, self.task, self.enc, self.ctx = net, task, enc, ctx
        self.heads = FrozenHeads(net, ctx)
        self.penalty = penalty
        self.D = task.num_devices

    @torch.no_grad()
    def device_states(self, placements: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """``S [C, D, enc]`` and ``occupied [C, D]`` of placements ``[C, T]``."""
        C, T = placements.shape
        flat = torch.from_numpy((np.arange(C)[:, None] * self.D + placements).reshape(-1))
        S = torch.zeros(C * self.D, self.enc.shape[1])
        S.index_add_(0, flat, self.enc.repeat(C, 1))
        occ = torch.zeros(C * self.D, dtype=torch.bool)
        occ[flat] = True
        return S.view(C, self.D, -1), occ.view(C, self.D)

    @torch.no_grad()
    def device_stats(self, S: torch.Tensor, occ: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(log_dev [C, D, 3], log_step [C], std [C])`` of device states: the members'
        mean log fwd/bwd/comm per device, the ensemble's log step (the slowest occupied
        device by those means) and the members' standard deviation of their own log
        step."""
        return self.member_stats(self.heads.member_device_log_costs(S), occ)

    @torch.no_grad()
    def member_stats(self, member: torch.Tensor, occ: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """:meth:`device_stats` from the members' log fwd/bwd/comm ``[C, D, K, 3]``."""
        log_dev, log_tot, member_tot = _device_totals(member)
        return (log_dev, *_step_stats(log_tot, member_tot, occ))

    @torch.no_grad()
    def score_states(self, S: torch.Tensor, occ: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(score, log_step, std)`` ``[C]`` of device states (see :meth:`device_stats`),
        ``score = log_step + penalty * std``."""
        _, log_step, std = self.device_stats(S, occ)
        return log_step + self.penalty * std, log_step, std

    @torch.no_grad()
    def score_changes(
        self, S: torch.Tensor, occ: torch.Tensor, changes: Changes
    ) -> tuple[torch.Tensor, ...]:
        """:meth:`score_states` of C placements that differ from one (device states
        ``S [1, D, enc]``, ``occ [1, D]``) on two devices each. The kernels of those two
        alone are evaluated, the others' are ``S``'s (the heads give a state the same
        values in any batch); the all-to-all, whose context terms can depend on their
        place in the batch, is evaluated on every device as :meth:`score_states` would,
        and where it gives every unchanged device ``S``'s value, the devices' totals are
        ``S``'s too and only the changed ones' are reduced."""
        C, rows = len(changes.devices), torch.arange(len(changes.devices)).unsqueeze(-1)
        width = S[..., -1].expand(C, -1).clone()
        width[rows, changes.devices] = changes.states[..., -1]
        comm = self.heads.log_comm(width * 256.0)
        base_comm = self.heads.log_comm(S[..., -1] * 256.0)
        moved = torch.zeros(C, self.D, dtype=torch.bool)
        moved[rows, changes.devices] = True
        occupied = occ.expand(C, -1).clone()
        occupied[rows, changes.devices] = changes.occupied
        base_fb = torch.log(self.heads.member_compute(S))
        fb = torch.log(self.heads.member_compute(changes.states))
        if torch.equal(torch.where(moved, base_comm, comm), base_comm.expand(C, -1)):
            _, base_tot, base_member_tot = _device_totals(_with_comm(base_fb, base_comm))
            _, tot, member_tot = _device_totals(_with_comm(fb, comm[rows, changes.devices]))
            log_tot = base_tot.expand(C, -1).clone()
            log_tot[rows, changes.devices] = tot
            all_member_tot = base_member_tot.expand(C, -1, -1).clone()
            all_member_tot[rows, changes.devices] = member_tot
            log_step, std = _step_stats(log_tot, all_member_tot, occupied)
        else:
            log_fb = base_fb.expand(C, -1, -1, -1).clone()
            log_fb[rows, changes.devices] = fb
            _, log_step, std = self.member_stats(_with_comm(log_fb, comm), occupied)
        return log_step + self.penalty * std, log_step, std

    def candidates(self, named: Mapping[str, np.ndarray]) -> list[Candidate]:
        names = list(named)
        placements = np.stack([np.asarray(named[n], dtype=np.int64) for n in names])
        score, mean, std = self.score_states(*self.device_states(placements))
        return [
            Candidate(n, placements[i], float(score[i]), float(mean[i]), float(std[i]))
            for i, n in enumerate(names)
        ]


def _with_comm(log_fb: torch.Tensor, comm: torch.Tensor) -> torch.Tensor:
    """``[..., D, K, 3]`` members' log fwd/bwd/comm from ``log_fb [..., D, K, 2]`` and the
    all-to-all ``comm [..., D]`` (the same for every member)."""
    comm = comm.unsqueeze(-1).unsqueeze(-1)
    return torch.cat([log_fb, comm.expand(*log_fb.shape[:-1], 1)], dim=-1)


def _device_totals(member: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per device, from the members' log fwd/bwd/comm ``[..., D, K, 3]``: their mean
    ``[..., D, 3]``, its log total ``[..., D]`` and each member's log total ``[..., D, K]``."""
    log_dev = member.mean(-2)
    return log_dev, torch.logsumexp(log_dev, -1), torch.logsumexp(member, -1)


def _step_stats(
    log_tot: torch.Tensor, member_tot: torch.Tensor, occ: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log_step, std)``: the largest log total of an occupied device, and the members'
    standard deviation of their own largest (0 for one member)."""
    neg = torch.finfo(log_tot.dtype).min
    log_step = log_tot.masked_fill(~occ, neg).amax(-1)
    steps = member_tot.masked_fill(~occ.unsqueeze(-1), neg).amax(-2)
    std = steps.std(-1) if steps.shape[-1] > 1 else torch.zeros_like(log_step)
    return log_step, std


# ----------------------------------------------------------------------------------------
# Refinement
# ----------------------------------------------------------------------------------------


@torch.no_grad()
def refine(scorer: Scorer, cand: Candidate, max_steps: int, seed: int = 0) -> Candidate:
    """Hill-climb ``cand`` on the penalised score: each step rates (in one batch) the
    moves of a table off the predicted bottleneck device to a device with room, its swaps
    with one table elsewhere and some with two (see :func:`_moves`) that keep both devices
    within memory (a random ``REFINE_CANDIDATES`` of them when there are more), and
    applies the best if it lowers the score; stops at a local optimum or after
    ``max_steps``."""
    task, enc = scorer.task, scorer.enc
    sizes = np.array([t.size_bytes for t in task.tables], dtype=np.float64)
    capacity = np.asarray(task.memory, dtype=np.float64)
    placement, now = cand.placement.copy(), cand.score
    rng = np.random.default_rng(seed)
    improved = False
    for _ in range(max_steps):
        S, occ = scorer.device_states(placement[None])
        log_tot = torch.logsumexp(scorer.heads.device_log_costs(S[0]), -1)
        b = int(log_tot.masked_fill(~occ[0], -1e30).argmax())
        moves = neighbour_moves(placement, b, sizes, capacity, rng)
        if not moves:
            break
        if len(moves) > REFINE_CANDIDATES:
            keep = rng.choice(len(moves), REFINE_CANDIDATES, replace=False)
            moves = [moves[k] for k in sorted(keep)]
        changes = Changes.of_moves(moves, b, S, enc, alone=int((placement == b).sum()) == 1)
        score, _, _ = scorer.score_changes(S, occ, changes)
        k = int(torch.argmin(score))
        if float(score[k]) >= now - 1e-6:
            break
        i, j, k2, d = moves[k]
        placement[i] = d
        for other in (j, k2):
            if other >= 0:
                placement[other] = b
        now, improved = float(score[k]), True
    if not improved:
        return cand
    return replace(scorer.candidates({cand.name: placement})[0], refined=True)


# ----------------------------------------------------------------------------------------
# The safety net
# ----------------------------------------------------------------------------------------


def heuristic_candidates(
    task: Task, single_costs: np.ndarray
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The plans of :func:`memory_aware_greedy` on each of the heuristics' proxies and on
    the predicted single-table costs, named ``memory_aware_<proxy>`` and
    ``memory_aware_predicted``, and the names of those that found none."""
    plans, failed = {}, {}
    costs = {f"memory_aware_{n}": [fn(t) for t in task.tables] for n, fn in PROXIES.items()}
    costs["memory_aware_predicted"] = list(single_costs)
    for name, c in costs.items():
        p = memory_aware_greedy(task, c)
        if p is None:
            failed[name] = "no device order fits memory"
        else:
            plans[name] = np.asarray(p, dtype=np.int64)
    return plans, failed


def distinct(named: Mapping[str, Sequence[int]]) -> dict[str, np.ndarray]:
    """The distinct plans of ``named``, each under the first name that gives it, in order."""
    unique: dict[tuple, str] = {}
    for name, p in named.items():
        unique.setdefault(tuple(int(d) for d in p), name)
    return {n: np.asarray(p) for p, n in unique.items()}


def choose(
    scorer: Scorer,
    named: Mapping[str, np.ndarray],
    failed: Mapping[str, str] | None = None,
    refine_top: int = REFINE_TOP,
    refine_steps: int = REFINE_STEPS,
    seed: int = 0,
) -> SafetyReport:
    """Score every candidate, refine the best ``refine_top`` (distinct plans only), and
    report them all, best first."""
    cands = scorer.candidates(distinct(named))
    cands.sort(key=lambda c: c.score)
    top = [refine(scorer, c, refine_steps, seed) for c in cands[:refine_top]]
    out = sorted(top + cands[refine_top:], key=lambda c: c.score)
    return SafetyReport(out, dict(failed or {}))
