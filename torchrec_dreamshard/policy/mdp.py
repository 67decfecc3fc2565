"""The estimated MDP: a task seen through the cost network (tables placed by predicted
single-table cost, descending; the only reward ``-log step_hat`` at the end), and policy
roll-outs on it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from torchrec_dreamshard.cost.cost_net import EPS_MS, CostNet, FrozenHeads, device_context
from torchrec_dreamshard.data.tasks import InsufficientMemoryError, Task
from torchrec_dreamshard.policy.packing import can_pack
from torchrec_dreamshard.policy.policy_net import NUM_SCALARS, FrozenPolicy, PolicyNet

LOG_EPS = math.log(EPS_MS)
LOG_EPS_32 = np.float32(LOG_EPS)  # what float32 state holds of it
NO_DEVICE_32 = np.float32(-1e30)  # an empty device's log total, below any real one


class PlacementError(InsufficientMemoryError):
    """No device has room for a table (the message names it): the tables do not fit."""


@dataclass
class Rollout:
    """``K`` roll-outs of the policy on a task's estimated MDP.

    Attributes:
        placements: ``[K, T]`` device per table, in the task's table order.
        inputs: ``[T, K, D, enc_dim + NUM_SCALARS]`` policy inputs per step (if recorded).
        legal: ``[T, K, D]`` legal-action masks (if recorded).
        actions: ``[T, K]`` chosen devices in placement order (if recorded).
    """

    placements: np.ndarray
    log_step: torch.Tensor
    inputs: torch.Tensor | None = None
    legal: torch.Tensor | None = None
    actions: torch.Tensor | None = None


@torch.no_grad()
def alone_on_a_device(
    net: CostNet, task: Task, inputs: np.ndarray
) -> tuple[torch.Tensor, FrozenHeads, torch.Tensor]:
    """The tables' encodings ``[T, enc_dim]``, the heads in the task's context, and each
    table's predicted fwd/bwd/comm ms alone on a device ``[T, 3]``.
    """
    heads = FrozenHeads(net, device_context(task.num_devices, sum(t.dim for t in task.tables)))
    enc = net.encode(torch.from_numpy(inputs))
    return enc, heads, torch.exp(heads.device_log_costs(enc))


@dataclass
class _Candidates:
    """K roll-outs' devices with the next table: ``S``, ``dev`` and ``tot`` (log totals)."""

    S: np.ndarray
    dev: np.ndarray
    tot: np.ndarray


@dataclass
class _Devices:
    """K roll-outs' devices part-way: encoding sums, log costs and totals, free bytes."""

    S: np.ndarray
    log_dev: np.ndarray
    log_tot: np.ndarray
    z: np.ndarray
    occupied: np.ndarray
    free: np.ndarray
    free_total: np.ndarray
    placed: bool = False

    def add(self, a: np.ndarray, size: float, cand: _Candidates) -> None:
        """Put the next table (``size`` bytes) on device ``a[k]`` in roll-out ``k``."""
        for k, d in enumerate(a.tolist()):
            self.S[k, d] = cand.S[k, d]
            self.log_dev[k, d] = cand.dev[k, d]
            self.log_tot[k, d] = self.z[k, d] = cand.tot[k, d]
            self.occupied[k, d] = True
            self.free[k, d] -= size
            self.free_total[k] -= size
        self.placed = True


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
        inputs: its tables' network inputs (``cost_inputs(task.tables, task.batch_size)``).
    """

    def __init__(self, cost_net: CostNet, task: Task, inputs: np.ndarray):
        self.net = cost_net
        self.task = task
        self.D = task.num_devices
        enc, self.heads, single = alone_on_a_device(cost_net, task, inputs)
        self.ctx = self.heads.ctx
        # per table, in the task's order: its encoding, its predicted fwd + bwd + comm and
        # fwd + bwd alone on a device
        self.table_enc = enc
        self.single_ms = single.sum(-1).numpy().astype(np.float64)
        self.single_compute_ms = single[:, :2].sum(-1).numpy().astype(np.float64)
        self.order = np.argsort(-self.single_ms, kind="stable")
        self.enc = enc[torch.from_numpy(self.order)]  # in placement order
        self._enc = self.enc.numpy()
        sizes = np.array([t.size_bytes for t in task.tables], dtype=np.float64)[self.order]
        self.sizes = sizes
        rev = sizes[::-1]
        # remaining-after-step-i sums and maxima
        self.rem_sum = np.concatenate([np.cumsum(rev)[::-1][1:], [0.0]])
        self.rem_max = np.concatenate([np.maximum.accumulate(rev)[::-1][1:], [0.0]])
        self.capacity = np.asarray(task.memory, dtype=np.float64)
        self._capacity32 = self.capacity.astype(np.float32)
        self._inv_capacity32 = np.float32(1.0) / self._capacity32
        self._exact_bytes = self.D * float(self.capacity.max()) < 2.0**53

    # -- legality -------------------------------------------------------------------------

    def room(self, i: int, free: np.ndarray) -> np.ndarray:
        """``[K, D]`` devices with room for table ``i`` (a ``PlacementError`` naming it where
        some roll-out has none)."""
        room = free >= self.sizes[i]
        if not room.any(axis=1).all():
            k = int(np.flatnonzero(~room.any(axis=1))[0])
            raise PlacementError(self._no_room_message(i, free[k]))
        return room

    def quick_feasible(self, i: int, free: np.ndarray, a: np.ndarray) -> np.ndarray:
        """``[K]``: whether any-fit surely packs the rest after table ``i`` goes to ``a[k]``
        (``sum_d max(0, free_d - s_max) >= remaining bytes``).
        """
        if self.rem_sum[i] == 0:
            return np.ones(len(a), dtype=bool)
        trial = free.copy()
        trial[np.arange(len(a)), a] -= self.sizes[i]
        return np.maximum(trial - self.rem_max[i], 0.0).sum(1) >= self.rem_sum[i]

    def feasible(self, i: int, free_row: np.ndarray, d: int) -> bool:
        """Whether the rest packs after table ``i`` goes to ``d``: any-fit bound, else FFD."""
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
            greedy: argmax actions (else sampled from the softmax over legal devices).
            record: keep the policy inputs, legal masks and actions for REINFORCE.
        """
        K, T = num, len(self.order)
        heads, logits_of = self.heads, FrozenPolicy.of(policy)
        dev = self._empty_devices(K)
        scalars = self._scalar_buffer(K)
        actions = np.zeros((T, K), dtype=np.int64)
        rec_u, rec_legal = [], []
        for i in range(T):
            room = self.room(i, dev.free)
            u, cand = self._step_inputs(i, dev, heads, scalars)
            if isinstance(logits_of, FrozenPolicy):
                logits = logits_of.numpy_logits(u, scalars)
            else:
                logits = logits_of(u).numpy()
            a = self._choose(logits, room, greedy, generator)
            legal = torch.from_numpy(room)
            if not self._surely_feasible(i, dev):
                for k in np.flatnonzero(~self.quick_feasible(i, dev.free, a)):
                    scores = torch.from_numpy(logits)
                    a[k] = self._feasible_choice(i, k, dev.free, scores, legal, greedy, generator)
            dev.add(a, self.sizes[i], cand)
            actions[i] = a
            if record:
                rec_u.append(u)
                rec_legal.append(legal)
        log_dev, occupied = torch.from_numpy(dev.log_dev), torch.from_numpy(dev.occupied)
        log_step = self.net.overall_log_cost(torch.from_numpy(dev.S), log_dev, occupied)
        placements = np.zeros((K, T), dtype=np.int64)
        placements[:, self.order] = actions.T
        if not record:
            return Rollout(placements, log_step)
        return Rollout(
            placements,
            log_step,
            torch.stack(rec_u),
            torch.stack(rec_legal),
            torch.from_numpy(actions),
        )

    @staticmethod
    def _choose(
        logits: np.ndarray,
        room: np.ndarray,
        greedy: bool,
        generator: torch.Generator | None,
    ) -> np.ndarray:
        """:func:`_choose` over the devices with ``room`` (numpy argmax when greedy)."""
        if greedy:
            return np.where(room, logits, -np.inf).argmax(-1)
        return _choose(torch.from_numpy(logits), torch.from_numpy(room), False, generator).numpy()

    def _surely_feasible(self, i: int, dev: _Devices) -> bool:
        """Whether :meth:`quick_feasible` holds wherever table ``i`` goes, in every roll-out."""
        if not self._exact_bytes:
            return False
        left = dev.free_total - self.sizes[i] - self.D * self.rem_max[i]
        return bool((left >= self.rem_sum[i]).all())

    def _empty_devices(self, K: int) -> _Devices:
        """``K`` roll-outs' devices before the first table."""
        S = np.zeros((K, self.D, self.net.enc_dim), dtype=np.float32)
        log_dev = np.full((K, self.D, 3), LOG_EPS, dtype=np.float32)
        log_tot = torch.logsumexp(torch.from_numpy(log_dev), -1).numpy()
        z = np.full((K, self.D), NO_DEVICE_32)
        occupied = np.zeros((K, self.D), dtype=bool)
        free = np.tile(self.capacity, (K, 1))
        return _Devices(S, log_dev, log_tot, z, occupied, free, free.sum(1))

    def _scalar_buffer(self, K: int) -> np.ndarray:
        """Where :meth:`_scalars` writes (``log2(D) / 6`` filled in: it never changes)."""
        out = np.empty((K, self.D, NUM_SCALARS), dtype=np.float32)
        out[..., 11] = float(self.ctx[0])
        return out

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
        """Re-choose roll-out ``k``'s device among those that keep the rest packable."""
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
        self, i: int, dev: _Devices, heads: FrozenHeads, scalars: np.ndarray
    ) -> tuple[torch.Tensor, _Candidates]:
        """Policy inputs ``[K, D, H + NUM_SCALARS]`` for table ``i``, and the candidate devices."""
        cand_S = torch.from_numpy(dev.S + self._enc[i])
        cand_dev = heads.device_log_costs(cand_S)
        cand_tot = torch.logsumexp(cand_dev, -1)
        cand = _Candidates(cand_S.numpy(), cand_dev.numpy(), cand_tot.numpy())
        scalars = torch.from_numpy(self._scalars(i, dev, cand, scalars))
        return torch.cat([torch.log1p(cand_S), scalars], dim=-1), cand

    def _scalars(self, i: int, dev: _Devices, cand: _Candidates, out: np.ndarray) -> np.ndarray:
        """``out [K, D, NUM_SCALARS]``: each device's predicted step, totals and costs were
        table ``i`` put there, as log-ratios to the current step; occupancy; memory before and
        after; fraction placed; ``log2(D) / 6`` (float32, as torch computes it)."""
        occupied = dev.occupied
        ref = self._now_step(dev)[:, None]
        np.subtract(self._cand_step(dev, cand.tot), ref, out=out[..., 0])
        np.subtract(cand.tot, ref, out=out[..., 1])
        now = np.where(occupied, dev.log_tot, LOG_EPS_32) - ref
        np.maximum(now, -10.0, out=out[..., 2])
        np.subtract(np.maximum(cand.tot, ref), ref, out=out[..., 3])
        out[..., 4] = occupied
        used = np.subtract(1.0, dev.free.astype(np.float32) / self._capacity32, out=out[..., 5])
        after = used + self._inv_capacity32 * np.float32(self.sizes[i])
        np.minimum(after, 2.0, out=out[..., 6])
        np.subtract(cand.dev, ref[..., None], out=out[..., 7:10])
        out[..., 10] = (i + 1) / len(self.order)
        return out

    def _now_step(self, dev: _Devices) -> np.ndarray:
        """Current predicted log step ``[K]`` (``LOG_EPS`` before any table)."""
        if not dev.placed:
            return np.full(len(dev.z), LOG_EPS_32)
        return dev.z.max(-1)

    def _cand_step(self, dev: _Devices, cand_tot: np.ndarray) -> np.ndarray:
        """Predicted log step ``[K, D]`` if table ``i`` went to each device."""
        if self.D == 1:
            return cand_tot
        top = np.sort(dev.z, axis=-1)
        first, second = top[:, -1:], top[:, -2:-1]
        return np.maximum(np.where(dev.z == first, second, first), cand_tot)
