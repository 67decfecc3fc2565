"""The estimated MDP: a task seen through the cost network, and roll-outs of the policy
on it (:mod:`torchrec_dreamshard.policy.network`).

Estimated MDP. The tables of a task are sorted by their predicted single-table cost,
descending, and placed one at a time. The state after step ``i`` is, per device ``d``, the
sum ``h_d`` of the cost network's encodings of the tables already there, the cost
network's log fwd/bwd/comm for it and the memory left. The action is a device with room
for table ``i`` (and, when memory is tight, from which the remaining tables can still be
packed: a first-fit-decreasing check). The only reward is ``-log step_hat`` at the end,
the cost network's overall prediction. No hardware is touched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from torchrec_dreamshard.cost.network import EPS_MS, CostNet, device_context
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.policy.network import PolicyNet

LOG_EPS = math.log(EPS_MS)


class PlacementError(ValueError):
    """No device has room for a table (the message names it)."""


@dataclass
class Rollout:
    """Result of rolling out the policy on a task's estimated MDP.

    Attributes:
        placements: ``[K, T]`` device per table, in the task's table order.
        log_step: ``[K]`` predicted log step cost of each roll-out.
        inputs: ``[T, K, D, enc_dim + NUM_SCALARS]`` policy inputs per step (if recorded).
        legal: ``[T, K, D]`` legal-action masks (if recorded).
        actions: ``[T, K]`` chosen devices in placement order (if recorded).
    """

    placements: np.ndarray
    log_step: torch.Tensor
    inputs: torch.Tensor | None = None
    legal: torch.Tensor | None = None
    actions: torch.Tensor | None = None


def ffd_fits(sizes: np.ndarray, free: np.ndarray) -> bool:
    """Whether first-fit-decreasing packs ``sizes`` into capacities ``free``."""
    free = free.astype(np.float64).copy()
    for s in np.sort(sizes)[::-1]:
        ok = np.flatnonzero(free >= s)
        if ok.size == 0:
            return False
        free[ok[0]] -= s
    return True


def can_pack(rest: np.ndarray, free: np.ndarray, d: int, size: float) -> bool:
    """Whether the tables ``rest`` (sizes sorted descending) can still be packed after a
    table of ``size`` goes to device ``d`` (``free``: each device's free bytes): the k-th
    largest surely finds room if the devices' room above it exceeds what the larger ones
    can have taken; else first-fit decreasing decides."""
    if rest.size == 0:
        return True
    trial = free.astype(np.float64)  # a copy
    trial[d] -= size
    # the room above the largest exceeds all that is left: every table surely finds room
    # (the bound below then holds for every k), decided in O(D)
    if np.maximum(trial - rest[0], 0.0).sum() > rest.sum():
        return True
    before = np.concatenate([[0.0], np.cumsum(rest)[:-1]])
    if (np.maximum(trial[None, :] - rest[:, None], 0.0).sum(1) > before).all():
        return True
    return ffd_fits(rest, trial)


def _choose(
    logits: torch.Tensor, legal: torch.Tensor, greedy: bool, generator: torch.Generator | None
) -> torch.Tensor:
    """Argmax or a sample of the softmax over the legal devices, ``[K]``."""
    masked = logits.masked_fill(~legal, float("-inf"))
    if greedy:
        return masked.argmax(-1)
    return torch.multinomial(torch.softmax(masked, -1), 1, generator=generator)[:, 0]


class EstimatedMDP:
    """One task seen through the cost network, ready for roll-outs.

    Args:
        cost_net: the cost network.
        task: the task.
        inputs: its tables' network inputs (``cost_inputs(task.tables, task.batch_size)``).
    """

    def __init__(self, cost_net: CostNet, task: Task, inputs: np.ndarray):
        self.net = cost_net
        self.task = task
        self.D = task.num_devices
        self.ctx = device_context(self.D, sum(t.dim for t in task.tables))
        with torch.no_grad():
            enc = cost_net.encode(torch.from_numpy(inputs))
            single = torch.exp(cost_net.device_log_costs(enc, self.ctx))
        # per table, in the task's order: its encoding, its predicted fwd + bwd + comm and
        # fwd + bwd alone on a device
        self.table_enc = enc
        self.single_ms = single.sum(-1).numpy().astype(np.float64)
        self.single_compute_ms = single[:, :2].sum(-1).numpy().astype(np.float64)
        self.order = np.argsort(-self.single_ms, kind="stable")
        self.enc = enc[torch.from_numpy(self.order)]  # in placement order
        sizes = np.array([t.size_bytes for t in task.tables], dtype=np.float64)[self.order]
        self.sizes = sizes
        rev = sizes[::-1]
        # remaining-after-step-i sums and maxima
        self.rem_sum = np.concatenate([np.cumsum(rev)[::-1][1:], [0.0]])
        self.rem_max = np.concatenate([np.maximum.accumulate(rev)[::-1][1:], [0.0]])
        self.capacity = np.asarray(task.memory, dtype=np.float64)

    # -- legality -------------------------------------------------------------------------

    def room(self, i: int, free: np.ndarray) -> np.ndarray:
        """``[K, D]`` devices with room for table ``i``.

        Raises:
            PlacementError: some roll-out has no device with room (names the table).
        """
        room = free >= self.sizes[i]
        if not room.any(axis=1).all():
            k = int(np.flatnonzero(~room.any(axis=1))[0])
            raise PlacementError(self._no_room_message(i, free[k]))
        return room

    def quick_feasible(self, i: int, free: np.ndarray, a: np.ndarray) -> np.ndarray:
        """``[K]``: after table ``i`` goes to device ``a[k]``, any-fit surely packs the
        rest: ``sum_d max(0, free_d - s_max) >= remaining bytes`` (a device refuses a
        table only when its free memory is below the largest remaining table)."""
        if self.rem_sum[i] == 0:
            return np.ones(len(a), dtype=bool)
        trial = free.copy()
        trial[np.arange(len(a)), a] -= self.sizes[i]
        return np.maximum(trial - self.rem_max[i], 0.0).sum(1) >= self.rem_sum[i]

    def feasible(self, i: int, free_row: np.ndarray, d: int) -> bool:
        """After table ``i`` goes to device ``d``, whether the remaining tables can be
        packed: per-table any-fit bound, else first-fit decreasing."""
        return can_pack(np.sort(self.sizes[i + 1 :])[::-1], free_row, d, self.sizes[i])

    def _no_room_message(self, i: int, free: np.ndarray) -> str:
        t = self.task.tables[int(self.order[i])]
        return (
            f"table {t.name!r} ({t.size_bytes} bytes) fits on no device: the most memory "
            f"left on any of the {self.D} devices is {int(free.max())} bytes; give the "
            "devices more memory or use fewer/smaller tables"
        )

    # -- roll-out -------------------------------------------------------------------------

    @torch.no_grad()
    def rollout(
        self,
        policy: PolicyNet,
        num: int = 1,
        greedy: bool = True,
        generator: torch.Generator | None = None,
        record: bool = False,
    ) -> Rollout:
        """Place every table, ``num`` roll-outs side by side.

        Args:
            policy: the policy network.
            num: roll-outs K.
            greedy: argmax actions (else sampled from the softmax over legal devices).
            generator: torch RNG for sampling.
            record: keep the policy inputs, legal masks and actions for REINFORCE.
        """
        K, D, T, H = num, self.D, len(self.order), self.net.enc_dim
        S = torch.zeros(K, D, H)
        log_dev = torch.full((K, D, 3), LOG_EPS)
        occupied = torch.zeros(K, D, dtype=torch.bool)
        free = np.tile(self.capacity, (K, 1))
        actions = torch.zeros(T, K, dtype=torch.int64)
        rec_u, rec_legal = [], []
        for i in range(T):
            legal = torch.from_numpy(self.room(i, free))
            u, cand_S, cand_dev = self._step_inputs(i, S, log_dev, occupied, free)
            logits = policy(u)
            a = _choose(logits, legal, greedy, generator)
            for k in np.flatnonzero(~self.quick_feasible(i, free, a.numpy())):
                a[k] = self._feasible_choice(i, k, free, logits, legal, greedy, generator)
            rows = torch.arange(K)
            S[rows, a] = cand_S[rows, a]
            log_dev[rows, a] = cand_dev[rows, a]
            occupied[rows, a] = True
            free[np.arange(K), a.numpy()] -= self.sizes[i]
            actions[i] = a
            if record:
                rec_u.append(u)
                rec_legal.append(legal)
        log_step = self.net.overall_log_cost(S, log_dev, occupied)
        placements = np.zeros((K, T), dtype=np.int64)
        placements[:, self.order] = actions.T.numpy()
        if not record:
            return Rollout(placements, log_step)
        return Rollout(placements, log_step, torch.stack(rec_u), torch.stack(rec_legal), actions)

    def _feasible_choice(
        self,
        i: int,
        k: int,
        free: np.ndarray,
        logits: torch.Tensor,
        legal: torch.Tensor,
        greedy: bool,
        generator: torch.Generator | None,
    ) -> int:
        """Re-choose roll-out ``k``'s device among those that keep the rest packable,
        removing refused devices from ``legal[k]`` (in place); if none does, keep the
        room-only choice."""
        first = None
        while legal[k].any():
            d = int(_choose(logits[k : k + 1], legal[k : k + 1], greedy, generator)[0])
            first = d if first is None else first
            if self.feasible(i, free[k], d):
                return d
            legal[k, d] = False
        legal[k] = torch.from_numpy(free[k] >= self.sizes[i])
        return int(first)

    def _step_inputs(
        self,
        i: int,
        S: torch.Tensor,
        log_dev: torch.Tensor,
        occupied: torch.Tensor,
        free: np.ndarray,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Policy inputs ``[K, D, H + NUM_SCALARS]`` for placing table ``i``, and the
        candidate device sums and log costs (``[K, D, H]``, ``[K, D, 3]``)."""
        net = self.net
        cand_S = S + self.enc[i]
        cand_dev = net.device_log_costs(cand_S, self.ctx)
        now_tot = torch.logsumexp(log_dev, -1).masked_fill(~occupied, LOG_EPS)
        cand_tot = torch.logsumexp(cand_dev, -1)
        now_step = self._now_step(S, log_dev, occupied)  # [K]
        cand_step = self._cand_step(S, now_tot, occupied, cand_S, cand_tot)  # [K, D]
        ref = now_step.unsqueeze(-1)
        cap = torch.from_numpy(self.capacity).float()
        used = 1.0 - torch.from_numpy(free).float() / cap
        after = used + float(self.sizes[i]) / cap
        n_frac = torch.full_like(used, (i + 1) / len(self.order))
        scalars = torch.stack(
            [
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
                n_frac,
                torch.full_like(used, float(self.ctx[0])),
            ],
            dim=-1,
        )
        u = torch.cat([torch.log1p(cand_S), scalars], dim=-1)
        return u, cand_S, cand_dev

    def _now_step(self, S: torch.Tensor, log_dev: torch.Tensor, occupied: torch.Tensor):
        """Current predicted log step ``[K]`` (``LOG_EPS`` before any table is placed)."""
        any_occ = occupied.any(-1)
        step = self.net.overall_log_cost(S, log_dev, occupied | ~any_occ.unsqueeze(-1))
        return torch.where(any_occ, step, torch.full_like(step, LOG_EPS))

    def _cand_step(self, S, now_tot, occupied, cand_S, cand_tot) -> torch.Tensor:
        """Predicted log step ``[K, D]`` if table ``i`` went to each device: the max over
        devices with device ``d`` replaced, from each channel's top two."""
        neg = -1e30
        z_now = self.net.device_z(S, now_tot).masked_fill(~occupied.unsqueeze(-1), neg)
        z_cand = self.net.device_z(cand_S, cand_tot)
        if self.D == 1:
            zmax = z_cand
        else:
            top = z_now.topk(2, dim=-2)
            is_top = z_now == top.values[:, :1]
            others = torch.where(is_top, top.values[:, 1:2], top.values[:, :1])
            zmax = torch.maximum(others, z_cand)
        return self.net.overall_from_max(zmax)
