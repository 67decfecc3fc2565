"""The safety net: candidate plans (policy roll-outs, memory-aware heuristics, callers'
sources) scored ``log step + penalty * std_k log step_k`` over the ensemble members, the
best few refined, the lowest score the winner."""

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


def memory_aware_greedy(task: Task, costs: Sequence[float]) -> list[int] | None:
    """Tables by ``costs`` descending, each to the least-loaded device with room from which
    the rest can still be packed (``None`` if none fits)."""
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


@dataclass
class Candidate:
    """One candidate plan and the cost model's view of it.

    Attributes:
        name: its source (``policy_greedy``, ``memory_aware_size``, a source's name, ...).
        score: ``log_step + penalty * log_std``.
        log_std: the members' standard deviation of their own log step cost.
        refined: whether :func:`refine` changed the source's plan.
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
        """Predicted step of source ``name``'s candidate over the winner's (``nan`` if absent)."""
        for c in self.candidates:
            if c.name == name:
                return float(math.exp(c.log_step - self.winner.log_step))
        return float("nan")

    def to_dict(self) -> dict:
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
        """``(log_dev [C, D, 3], log_step [C], std [C])`` of device states."""
        return self.member_stats(self.heads.member_device_log_costs(S), occ)

    @torch.no_grad()
    def member_stats(self, member: torch.Tensor, occ: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """:meth:`device_stats` from the members' log fwd/bwd/comm ``[C, D, K, 3]``."""
        log_dev, log_tot, member_tot = _device_totals(member)
        return (log_dev, *_step_stats(log_tot, member_tot, occ))

    @torch.no_grad()
    def score_states(self, S: torch.Tensor, occ: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(score, log_step, std)`` ``[C]`` of device states."""
        _, log_step, std = self.device_stats(S, occ)
        return log_step + self.penalty * std, log_step, std

    @torch.no_grad()
    def score_changes(
        self, S: torch.Tensor, occ: torch.Tensor, changes: Changes
    ) -> tuple[torch.Tensor, ...]:
        """:meth:`score_states` of C placements that each differ from ``S`` on two devices
        (only their kernels evaluated; the all-to-all everywhere)."""
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
    """``[..., D, K, 3]`` from ``log_fb [..., D, K, 2]`` and the all-to-all ``comm [..., D]``."""
    comm = comm.unsqueeze(-1).unsqueeze(-1)
    return torch.cat([log_fb, comm.expand(*log_fb.shape[:-1], 1)], dim=-1)


def _device_totals(member: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The members' mean ``[..., D, 3]``, its log total and each member's log total."""
    log_dev = member.mean(-2)
    return log_dev, torch.logsumexp(log_dev, -1), torch.logsumexp(member, -1)


def _step_stats(
    log_tot: torch.Tensor, member_tot: torch.Tensor, occ: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log_step, std)`` over occupied devices (std 0 for one member)."""
    neg = torch.finfo(log_tot.dtype).min
    log_step = log_tot.masked_fill(~occ, neg).amax(-1)
    steps = member_tot.masked_fill(~occ.unsqueeze(-1), neg).amax(-2)
    std = steps.std(-1) if steps.shape[-1] > 1 else torch.zeros_like(log_step)
    return log_step, std


@torch.no_grad()
def refine(scorer: Scorer, cand: Candidate, max_steps: int, seed: int = 0) -> Candidate:
    """Hill-climb ``cand`` on the penalised score: each step rates the bottleneck device's
    moves and swaps in one batch and applies the best that lowers the score, until none does
    or ``max_steps``."""
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


def heuristic_candidates(
    task: Task, single_costs: np.ndarray
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """:func:`memory_aware_greedy` plans on each proxy and on predicted costs, and the
    names of those that found none."""
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
    """Score every candidate, refine the best ``refine_top`` distinct plans, report all."""
    cands = scorer.candidates(distinct(named))
    cands.sort(key=lambda c: c.score)
    top = [refine(scorer, c, refine_steps, seed) for c in cands[:refine_top]]
    out = sorted(top + cands[refine_top:], key=lambda c: c.score)
    return SafetyReport(out, dict(failed or {}))
