"""The estimated MDP, the policy network and the trained agent, :class:`DreamShard`.

Estimated MDP. The tables of a task are sorted by their predicted single-table cost,
descending, and placed one at a time. The state after step ``i`` is, per device ``d``, the
sum ``h_d`` of the cost network's encodings of the tables already there, the cost
network's log fwd/bwd/comm for it and the memory left. The action is a device with room
for table ``i`` (and, when memory is tight, from which the remaining tables can still be
packed: a first-fit-decreasing check). The only reward is ``-log step_hat`` at the end,
the cost network's overall prediction. No hardware is touched.

Policy. Unlike the original DreamShard, the policy sees the table it is placing: for each
device ``d`` it gets the state *as if table i were added there*,
``h'_d = h_d + e_i``, the cost network's device costs ``t'_d`` and overall step
``s'_d`` for that state, and the current ones, all as log-ratios to the current step
(so they do not depend on the task's scale) plus the memory used. The logit is

    l_d = pi(u_d) - a * (log s'_d - log s) - b * (log t'_d - log s),

with ``u_d = [log(1 + h'_d), scalars]``, ``pi`` an MLP, ``a, b > 0`` learned scalars
(softplus). The two prior terms make the untrained policy a cost-greedy placer (the device
whose addition raises the predicted step least, then the least loaded one), and REINFORCE
learns the correction ``pi``. ``pi(u)`` is computed for all devices at once, so one step
costs a few small matrix products whatever the number of devices.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from torchrec_dreamshard.cost_model import EPS_MS, CostNet, device_context, mlp, single_thread
from torchrec_dreamshard.tables import table_features
from torchrec_dreamshard.tasks import Task, check_placement

NUM_SCALARS = 12  # scalar inputs per device besides log(1 + h'_d)
LOG_EPS = math.log(EPS_MS)
REFINE_STEPS = 64  # improving moves/swaps search mode makes after its roll-outs
REFINE_CANDIDATES = 512  # moves/swaps rated per refinement step, at most
BATCH_WARN_RATIO = 4.0  # warn when a task's batch is this far from the training batch


@dataclass
class CostPrediction:
    """The cost network's view of a placement (ms, scaled to the task's batch size).

    Attributes:
        fwd_ms: per device, forward (0 for an empty device).
        bwd_ms: per device, backward.
        comm_ms: per device, communication.
        step_ms: the overall head's step cost.
    """

    fwd_ms: list[float]
    bwd_ms: list[float]
    comm_ms: list[float]
    step_ms: float

    @property
    def total_ms(self) -> list[float]:
        """Per device ``fwd + bwd + comm``."""
        return [f + b + c for f, b, c in zip(self.fwd_ms, self.bwd_ms, self.comm_ms, strict=True)]


class PlacementError(ValueError):
    """No device has room for a table (the message names it)."""


class PolicyNet(nn.Module):
    """Per-device logit ``l_d`` (see the module docstring).

    Args:
        hidden: width of the cost network's encodings (input) and of the MLP.
    """

    def __init__(self, hidden: int = 64):
        super().__init__()
        self.hidden = hidden
        self.body = mlp([hidden + NUM_SCALARS, hidden, hidden, 1])
        with torch.no_grad():
            self.body[-1].weight.mul_(0.1)
            self.body[-1].bias.zero_()
        # softplus^-1 of the prior weights a = 20, b = 2
        self.prior_raw = nn.Parameter(torch.tensor([20.0, 2.0 + math.log(-math.expm1(-2.0))]))

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """Logits ``[...]`` from per-device inputs ``u`` ``[..., hidden + NUM_SCALARS]``;
        the scalars' first two entries are the step and device-total log-ratios."""
        a, b = F.softplus(self.prior_raw)
        scal = u[..., self.hidden :]
        return self.body(u).squeeze(-1) - a * scal[..., 0] - b * scal[..., 1]


# ----------------------------------------------------------------------------------------
# The estimated MDP
# ----------------------------------------------------------------------------------------


@dataclass
class Rollout:
    """Result of rolling out the policy on a task's estimated MDP.

    Attributes:
        placements: ``[K, T]`` device per table, in the task's table order.
        log_step: ``[K]`` predicted log step cost of each roll-out.
        inputs: ``[T, K, D, hidden + NUM_SCALARS]`` policy inputs per step (if recorded).
        legal: ``[T, K, D]`` legal-action masks (if recorded).
        actions: ``[T, K]`` chosen devices in placement order (if recorded).
    """

    placements: np.ndarray
    log_step: torch.Tensor
    inputs: torch.Tensor | None = None
    legal: torch.Tensor | None = None
    actions: torch.Tensor | None = None


def _ffd_fits(sizes: np.ndarray, free: np.ndarray) -> bool:
    """Whether first-fit-decreasing packs ``sizes`` into capacities ``free``."""
    free = free.astype(np.float64).copy()
    for s in np.sort(sizes)[::-1]:
        ok = np.flatnonzero(free >= s)
        if ok.size == 0:
            return False
        free[ok[0]] -= s
    return True


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
        features: its table features (``table_features(task.tables, batch)``).
    """

    def __init__(self, cost_net: CostNet, task: Task, features: np.ndarray):
        self.net = cost_net
        self.task = task
        self.D = task.num_devices
        self.ctx = device_context(self.D, sum(t.dim for t in task.tables))
        with torch.no_grad():
            enc = cost_net.encode(torch.from_numpy(features))
            single = cost_net.device_log_costs(enc, self.ctx)
        self.single_ms = torch.exp(single).sum(-1).numpy().astype(np.float64)
        self.order = np.argsort(-self.single_ms, kind="stable")
        self.enc = enc[torch.from_numpy(self.order)]
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
        trial = free_row.copy()
        trial[d] -= self.sizes[i]
        rem = np.sort(self.sizes[i + 1 :])[::-1]
        before = np.concatenate([[0.0], np.cumsum(rem)[:-1]])
        # the j-th largest table finds room if the devices' room above it exceeds what
        # the larger ones can have taken
        if (np.maximum(trial[None, :] - rem[:, None], 0.0).sum(1) > before).all():
            return True
        return _ffd_fits(rem, trial)

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
        K, D, T, H = num, self.D, len(self.order), self.net.hidden
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


# ----------------------------------------------------------------------------------------
# Search-mode refinement
# ----------------------------------------------------------------------------------------


@torch.no_grad()
def refine(mdp: EstimatedMDP, placement: np.ndarray, max_steps: int, seed: int = 0) -> np.ndarray:
    """Hill-climb ``placement`` on the cost network's step cost.

    Each step rates, in one batch, every move of a table off the predicted bottleneck
    device to another device with room and every swap of such a table with a table
    elsewhere that keeps both devices within memory (a random ``REFINE_CANDIDATES`` of
    them when there are more), and applies the best if it lowers the predicted step; it
    stops at a local optimum or after ``max_steps``.
    """
    net, task = mdp.net, mdp.task
    enc = torch.empty_like(mdp.enc)
    enc[torch.from_numpy(mdp.order)] = mdp.enc  # back to table order
    sizes = np.array([t.size_bytes for t in task.tables], dtype=np.float64)
    D = mdp.D
    placement = placement.copy()
    rng = np.random.default_rng(seed)
    for _ in range(max_steps):
        S = torch.zeros(D, enc.shape[1]).index_add(0, torch.from_numpy(placement), enc)
        occ = torch.from_numpy(np.bincount(placement, minlength=D) > 0)
        log_dev = net.device_log_costs(S, mdp.ctx)
        now = float(net.overall_log_cost(S, log_dev, occ))
        b = int(torch.logsumexp(log_dev, -1).masked_fill(~occ, -1e30).argmax())
        cands = _candidates(placement, b, sizes, mdp.capacity)
        if not cands:
            break
        if len(cands) > REFINE_CANDIDATES:  # bound the work on big tasks
            keep = rng.choice(len(cands), REFINE_CANDIDATES, replace=False)
            cands = [cands[k] for k in sorted(keep)]
        moves = torch.tensor(cands, dtype=torch.int64)  # (i, j or -1, d)
        C = len(cands)
        S_c = S.expand(C, D, -1).clone()
        rows = torch.arange(C)
        ei = enc[moves[:, 0]]
        ej = torch.where((moves[:, 1] >= 0).unsqueeze(-1), enc[moves[:, 1].clamp(min=0)], 0.0)
        S_c[rows, b] += ej - ei
        S_c[rows, moves[:, 2]] += ei - ej
        occ_c = occ.expand(C, D).clone()
        occ_c[rows, moves[:, 2]] = True
        pl_counts = np.bincount(placement, minlength=D)
        if pl_counts[b] == 1:
            occ_c[rows, b] = moves[:, 1] >= 0
        cost = net.overall_log_cost(S_c, net.device_log_costs(S_c, mdp.ctx), occ_c)
        k = int(torch.argmin(cost))
        if float(cost[k]) >= now - 1e-6:
            break
        i, j, d = cands[k]
        placement[i] = d
        if j >= 0:
            placement[j] = b
    return placement


def _candidates(
    placement: np.ndarray, b: int, sizes: np.ndarray, capacity: np.ndarray
) -> list[tuple[int, int, int]]:
    """Legal moves ``(i, -1, d)`` and swaps ``(i, j, d)`` of tables ``i`` on device ``b``."""
    used = np.bincount(placement, weights=sizes, minlength=len(capacity))
    free = capacity - used
    on_b = np.flatnonzero(placement == b)
    others = np.flatnonzero(placement != b)
    out = []
    for i in on_b:
        for d in np.flatnonzero(free >= sizes[i]):
            if d != b:
                out.append((int(i), -1, int(d)))
        if others.size:
            d_j = placement[others]
            ok = (free[d_j] + sizes[others] >= sizes[i]) & (free[b] + sizes[i] >= sizes[others])
            out.extend((int(i), int(j), int(placement[j])) for j in others[ok])
    return out


# ----------------------------------------------------------------------------------------
# The agent
# ----------------------------------------------------------------------------------------


class DreamShard:
    """The trained agent: cost network, policy and metadata.

    Args:
        cost_net: the cost network.
        policy: the policy network (same hidden width).
        meta: metadata (hardware fingerprint, workload, batch size, version, ...).
    """

    def __init__(self, cost_net: CostNet, policy: PolicyNet, meta: dict[str, Any] | None = None):
        if cost_net.hidden != policy.hidden:
            raise ValueError(
                f"cost net width {cost_net.hidden} and policy width {policy.hidden} differ"
            )
        self.cost_net = cost_net.eval()
        self.policy = policy.eval()
        self.meta: dict[str, Any] = dict(meta or {})
        self.meta.setdefault("batch_size", 2048)
        self.meta.setdefault("hidden", cost_net.hidden)

    @classmethod
    def untrained(cls, seed: int = 0, hidden: int = 64) -> DreamShard:
        """Randomly initialised networks (deterministic in ``seed``)."""
        torch.manual_seed(seed)
        from torchrec_dreamshard import __version__

        meta = {"trained": False, "seed": seed, "version": __version__, "hidden": hidden}
        return cls(CostNet(hidden), PolicyNet(hidden), meta)

    # -- helpers --------------------------------------------------------------------------

    def features(self, task: Task) -> np.ndarray:
        """Table features at the batch size the networks were trained on."""
        return table_features(task.tables, int(self.meta["batch_size"]))

    def batch_scale(self, task: Task) -> float:
        """Factor from the trained batch size's milliseconds to the task's (linear in the
        batch; warns when the batch is far from the training one)."""
        ratio = task.batch_size / float(self.meta["batch_size"])
        if not 1 / BATCH_WARN_RATIO <= ratio <= BATCH_WARN_RATIO:
            warnings.warn(
                f"task batch size {task.batch_size} is far from the batch size "
                f"{self.meta['batch_size']} this agent was trained on; predicted costs are "
                "scaled linearly and may be off",
                stacklevel=3,
            )
        return ratio

    def mdp(self, task: Task) -> EstimatedMDP:
        """The task's estimated MDP."""
        return EstimatedMDP(self.cost_net, task, self.features(task))

    # -- public API -----------------------------------------------------------------------

    def place(
        self, task: Task, mode: str = "greedy", num_samples: int = 16, seed: int = 0
    ) -> list[int]:
        """A device per table, respecting every device's memory.

        Args:
            task: the task.
            mode: ``"greedy"`` (one argmax roll-out) or ``"search"`` (the greedy roll-out
                plus ``num_samples`` sampled ones; the one the cost network rates best,
                then improved by moves and swaps the cost network rates better, see
                :func:`refine`).
            num_samples: sampled roll-outs in search mode.
            seed: sampling seed.

        Raises:
            PlacementError: a table fits on no device (named in the message).
        """
        if mode not in ("greedy", "search"):
            raise ValueError(f"mode must be 'greedy' or 'search', got {mode!r}")
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        with single_thread():
            return self._place(task, mode, num_samples, seed)

    def _place(self, task: Task, mode: str, num_samples: int, seed: int) -> list[int]:
        mdp = self.mdp(task)
        best = mdp.rollout(self.policy, 1, greedy=True)
        placement, best_cost = best.placements[0], float(best.log_step[0])
        if mode == "search":
            gen = torch.Generator().manual_seed(seed)
            res = mdp.rollout(self.policy, num_samples, greedy=False, generator=gen)
            k = int(torch.argmin(res.log_step))
            if float(res.log_step[k]) < best_cost:
                placement = res.placements[k]
            placement = refine(mdp, np.asarray(placement), REFINE_STEPS, seed)
        return check_placement(task, [int(d) for d in placement])

    @single_thread()
    @torch.no_grad()
    def predict(self, task: Task, placement: Sequence[int]) -> CostPrediction:
        """The cost network's per-device and overall cost of ``placement``."""
        placement = check_placement(task, placement)
        D, H = task.num_devices, self.cost_net.hidden
        enc = self.cost_net.encode(torch.from_numpy(self.features(task)))
        S = torch.zeros(D, H).index_add(0, torch.tensor(placement), enc)
        occupied = torch.zeros(D, dtype=torch.bool)
        occupied[torch.tensor(placement)] = True
        ctx = device_context(D, sum(t.dim for t in task.tables))
        log_dev = self.cost_net.device_log_costs(S, ctx)
        log_step = self.cost_net.overall_log_cost(S, log_dev, occupied)
        scale = self.batch_scale(task)
        dev = (torch.exp(log_dev) * occupied.unsqueeze(-1)).numpy().astype(float) * scale
        return CostPrediction(
            fwd_ms=dev[:, 0].tolist(),
            bwd_ms=dev[:, 1].tolist(),
            comm_ms=dev[:, 2].tolist(),
            step_ms=float(torch.exp(log_step)) * scale,
        )

    @single_thread()
    @torch.no_grad()
    def table_costs(self, task: Task) -> np.ndarray:
        """Predicted single-table fwd + bwd + comm (ms) of each table, alone on a device."""
        return self.mdp(task).single_ms * self.batch_scale(task)
