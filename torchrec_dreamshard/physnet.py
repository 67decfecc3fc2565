"""The cost network: physical quantities summed exactly per device, a learned monotone
correction for fusion, and an ensemble whose spread is the model's uncertainty.

Inputs. Each table ``i`` is seen as ``x_i = [s_i, q_i]``: its shape features ``s_i``
(``log2(dim) / 8``, ``log10(rows) / 8``, ``log10(bytes) / 11`` and the 17 reuse fractions;
no pooling factor) and its scaled physical quantities ``q_i >= 0``
(:func:`torchrec_dreamshard.physics.table_quantities`: lookups, bags, elements gathered,
unique rows, elements updated, table elements, and the gathered/updated elements split
over five table-size buckets). Both come from fixed constants, so a table has the same
input in every task, at the task's own batch size.

One member ``k`` of the ensemble. A table's encoding is non-negative and grows with its
physical quantities,

    e_i = relu(A_k^+ log(1 + q_i) + g_k(s_i))          (A^+ >= 0 elementwise),

and a device holding the tables ``S_d`` is seen through two exact sums,
``Q_d = sum_{i in S_d} q_i`` and ``H_d = sum_{i in S_d} e_i``. Its forward and backward
times are a physical part plus a fusion part,

    (f_d, b_d) = c_k + W_k^+ Q_d + V_k^+ relu(U_k^+ log(1 + H_d) + u_k),

with every ``+`` weight non-negative (softplus of a free parameter). Adding a table to a
device, or raising any of a table's physical quantities (more lookups, more unique rows),
therefore never lowers a predicted time: the network can only learn how fusion departs
from the physical sums, not reverse them, and the physical part extrapolates linearly
beyond the tables it was trained on.

The all-to-all has the latency-bandwidth form of a collective (shared by the members):
with D devices, total pooled width W and the device's width ``w_d``,
``m_d = p (D - 1) + q (W + (D - 2) w_d) / (1000 D) + r`` (0 when D = 1).

Step. Measured step cost is ``max_d (f_d + b_d + m_d)``, so the network predicts exactly
that: ``log step = max_d log t_d`` over non-empty devices.

Ensemble. ``K`` members, each initialised apart and fitted on its own bootstrap
re-weighting of the samples. The prediction is the mean of the members' log costs; their
standard deviation is the uncertainty a planner adds as a penalty, so that a search
cannot profit from a placement only some members believe in.

Loss. Squared error of logarithms (a relative error, symmetric in over- and
under-prediction), per member with its bootstrap weights, on the device forward,
backward and (on more than one device) all-to-all times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from torchrec_dreamshard.physics import NUM_QUANTITIES, table_quantities
from torchrec_dreamshard.tables import NUM_REUSE_BINS, TableSpec, table_features

CTX_SCALE = 6.0  # log2(D) / 6: 64 devices -> 1.0
WIDTH_SCALE = 14.0  # log2(1 + W) / 14: total width 16384 -> 1.0
NUM_CTX = 2
NO_COMM_LOG = math.log(1e-6)  # log ms of the communication of a single device (none)
SHAPE_COLUMNS = [0, 1, 3, *range(4, 4 + NUM_REUSE_BINS)]  # table_features minus pooling
NUM_SHAPE = len(SHAPE_COLUMNS)
INPUT_DIM = NUM_SHAPE + NUM_QUANTITIES


def cost_inputs(tables: Sequence[TableSpec], batch_size: int) -> np.ndarray:
    """``[T, INPUT_DIM]`` network inputs ``[s_i, q_i]`` at ``batch_size`` (float32)."""
    shape = table_features(tables, batch_size)[:, SHAPE_COLUMNS]
    return np.concatenate([shape, table_quantities(tables, batch_size)], axis=1).astype(np.float32)


def context_values(num_devices: int, total_dim: int) -> list[float]:
    """The task context ``[log2(D) / 6, log2(1 + W) / 14]``."""
    return [math.log2(num_devices) / CTX_SCALE, math.log2(1 + total_dim) / WIDTH_SCALE]


def device_context(num_devices: int, total_dim: int) -> torch.Tensor:
    """The task context as a ``[NUM_CTX]`` float tensor."""
    return torch.tensor(context_values(num_devices, total_dim), dtype=torch.float32)


def _param(*shape: int, scale: float) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape) * scale)


class CostNet(nn.Module):
    """An ensemble of physical-plus-monotone-fusion cost models (see the module
    docstring). A placement's state per device is one additive vector, the sum of the
    tables' :meth:`encode` rows: ``[Q_d, H_d^1, ..., H_d^K, w_d / 256]``.

    Args:
        hidden: width of each member's encodings ``e_i``.
        members: ensemble size K.
    """

    def __init__(self, hidden: int = 16, members: int = 5):
        super().__init__()
        if hidden < 1 or members < 1:
            raise ValueError(f"hidden and members must be >= 1, got {hidden}, {members}")
        self.hidden, self.members = hidden, members
        K, h, Q = members, hidden, NUM_QUANTITIES
        self.enc_dim = Q + K * h + 1
        # table encoder: e = relu(A+ log1p(q) + g(s)), g a one-hidden-layer MLP
        self.A_raw = _param(K, Q, h, scale=0.5)
        self.A_raw.data -= 2.0
        self.g1 = _param(K, NUM_SHAPE, h, scale=1 / math.sqrt(NUM_SHAPE))
        self.g1_b = nn.Parameter(torch.zeros(K, 1, h))
        self.g2 = _param(K, h, h, scale=1 / math.sqrt(h))
        self.g2_b = nn.Parameter(torch.zeros(K, 1, h))
        # device heads: c + W+ Q + V+ relu(U+ log1p(H) + u), two outputs (fwd, bwd)
        self.c_raw = nn.Parameter(torch.full((K, 2), -3.0))
        self.W_raw = nn.Parameter(torch.full((K, Q, 2), -2.5) + 0.5 * torch.randn(K, Q, 2))
        self.U_raw = nn.Parameter(torch.randn(K, h, h) * 0.5 - 2.0)
        self.u = nn.Parameter(torch.zeros(K, 1, h))
        self.V_raw = nn.Parameter(torch.full((K, h, 2), -5.0) + 0.5 * torch.randn(K, h, 2))
        # all-to-all constants (ms per peer, ms per kilo-dim of load, ms), softplus^-1
        self.comm_raw = nn.Parameter(torch.tensor([1.0, 5.0, -2.0]))

    # -- tables ---------------------------------------------------------------------------

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, enc_dim]`` table encodings ``[q_i, e_i^1..e_i^K, dim_i / 256]`` from
        inputs ``x`` ``[T, INPUT_DIM]``."""
        shape, q = x[:, :NUM_SHAPE], x[:, NUM_SHAPE:]
        hid = torch.relu(torch.einsum("ts,ksh->kth", shape, self.g1) + self.g1_b)
        g = torch.einsum("kth,khj->ktj", hid, self.g2) + self.g2_b
        e = torch.relu(torch.einsum("tq,kqh->kth", torch.log1p(q), F.softplus(self.A_raw)) + g)
        width = torch.exp2(shape[:, 0:1] * 8.0) / 256.0
        return torch.cat([q, e.permute(1, 0, 2).reshape(len(x), -1), width], dim=-1)

    # -- devices --------------------------------------------------------------------------

    def member_compute(self, S: torch.Tensor) -> torch.Tensor:
        """``[..., K, 2]`` each member's forward and backward ms of device states ``S``
        ``[..., enc_dim]``."""
        K, h, Q = self.members, self.hidden, NUM_QUANTITIES
        lead = S.shape[:-1]
        q = S[..., :Q]
        H = S[..., Q : Q + K * h].reshape(*lead, K, h)
        phys = torch.einsum("...q,kqo->...ko", q, F.softplus(self.W_raw))
        z = torch.relu(
            torch.einsum("...kh,khj->...kj", torch.log1p(H), F.softplus(self.U_raw))
            + self.u.squeeze(1)
        )
        fusion = torch.einsum("...kj,kjo->...ko", z, F.softplus(self.V_raw))
        return F.softplus(self.c_raw) + phys + fusion

    def log_comm(self, width: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """Log all-to-all ms of a device of pooled width ``w`` among D devices of total
        width W (see the module docstring); none for one device."""
        D = torch.exp2(ctx[..., 0] * CTX_SCALE)
        W = torch.exp2(ctx[..., 1] * WIDTH_SCALE) - 1.0
        p, q, r = F.softplus(self.comm_raw)
        load = (W + (D - 2.0) * width).clamp(min=0.0) / (1000.0 * D)
        log_m = torch.log(p * (D - 1.0) + q * load + r)
        return torch.where(D > 1.5, log_m, torch.full_like(log_m, NO_COMM_LOG))

    def member_device_log_costs(self, S: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """``[..., K, 3]`` each member's log fwd/bwd/comm (ms)."""
        c = ctx.expand(*S.shape[:-1], ctx.shape[-1])
        log_fb = torch.log(self.member_compute(S))
        comm = self.log_comm(S[..., -1] * 256.0, c).unsqueeze(-1).unsqueeze(-1)
        return torch.cat([log_fb, comm.expand(*log_fb.shape[:-1], 1)], dim=-1)

    def device_log_costs(self, h: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """``[..., 3]`` log fwd/bwd/comm (ms): the members' mean in log space."""
        return self.member_device_log_costs(h, ctx).mean(dim=-2)

    # -- placements -----------------------------------------------------------------------

    def device_z(self, h: torch.Tensor, log_total: torch.Tensor) -> torch.Tensor:
        """What the step max-reduces over devices: ``[log t_d]``."""
        return log_total.unsqueeze(-1)

    def overall_from_max(self, zmax: torch.Tensor) -> torch.Tensor:
        """``log step = max_d log t_d``."""
        return zmax[..., -1]

    def overall_log_cost(
        self, h: torch.Tensor, log_dev: torch.Tensor, occupied: torch.Tensor
    ) -> torch.Tensor:
        """``[...]`` log step cost: the max over occupied devices of ``log t_d``, from
        ``log_dev`` ``[..., D, 3]`` (``h`` is unused, kept for the MDP's interface)."""
        log_total = torch.logsumexp(log_dev, dim=-1)
        return log_total.masked_fill(~occupied, torch.finfo(log_total.dtype).min).amax(-1)

    def member_log_steps(self, S: torch.Tensor, ctx: torch.Tensor, occupied: torch.Tensor):
        """``[..., K]`` each member's log step cost of device states ``S`` ``[..., D, enc]``."""
        log_total = torch.logsumexp(self.member_device_log_costs(S, ctx), dim=-1)  # [..., D, K]
        neg = torch.finfo(log_total.dtype).min
        return log_total.masked_fill(~occupied.unsqueeze(-1), neg).amax(-2)


# ----------------------------------------------------------------------------------------
# Samples, packing, fitting
# ----------------------------------------------------------------------------------------

EPS_MS = 1e-3  # ms; floor under measured costs before taking logs
HUBER_BETA = 0.1  # log-error beyond which the loss grows linearly (robust to timing spikes)


@dataclass
class CostSample:
    """One measured placement (or one measured fused kernel, as a 1-device placement).

    Attributes:
        group: the task it belongs to (held-out splits, per-task rank metrics).
        inputs: ``[T, INPUT_DIM]`` (:func:`cost_inputs`).
        devices: table indices per non-empty device.
        context: the task context (:func:`context_values`).
        dev_ms: ``[M, 3]`` measured fwd/bwd/comm per non-empty device (ms).
        step_ms: measured step cost (ms).
    """

    group: str
    inputs: np.ndarray
    devices: list[list[int]]
    context: list[float]
    dev_ms: np.ndarray
    step_ms: float


def sample_from_measurement(
    group: str,
    tables: Sequence[TableSpec],
    placement: Sequence[int],
    num_devices: int,
    batch_size: int,
    per_device: Sequence[tuple[float, float, float]],
) -> CostSample:
    """A :class:`CostSample` from a measured placement (``per_device`` lists
    ``(fwd, bwd, comm)`` ms for every device, empty ones included)."""
    devices = [[i for i, p in enumerate(placement) if p == d] for d in range(num_devices)]
    keep = [d for d in range(num_devices) if devices[d]]
    dev_ms = np.asarray([per_device[d] for d in keep], dtype=np.float64).reshape(-1, 3)
    context = context_values(num_devices, sum(t.dim for t in tables))
    step = float(max(sum(per_device[d]) for d in keep))
    return CostSample(
        group, cost_inputs(tables, batch_size), [devices[d] for d in keep], context, dev_ms, step
    )


@dataclass
class Packed:
    """Several placements' devices flattened for one network call."""

    x: torch.Tensor  # [N, INPUT_DIM] inputs of every (device, table) pair
    device_of_table: torch.Tensor  # [N] row in the device list
    ctx: torch.Tensor  # [M, NUM_CTX]
    placement_of_device: torch.Tensor  # [M]
    num_devices: int
    num_placements: int


def pack(samples: Sequence[CostSample]) -> Packed:
    """Pack samples' non-empty devices for :func:`member_predictions`."""
    xs, dev_of_tab, ctx, pl_of_dev = [], [], [], []
    m = 0
    for p, s in enumerate(samples):
        for tables in s.devices:
            xs.append(s.inputs[np.asarray(tables, dtype=np.int64)])
            dev_of_tab.append(np.full(len(tables), m, dtype=np.int64))
            ctx.append(s.context)
            pl_of_dev.append(p)
            m += 1
    return Packed(
        x=torch.from_numpy(np.concatenate(xs).astype(np.float32)),
        device_of_table=torch.from_numpy(np.concatenate(dev_of_tab)),
        ctx=torch.tensor(ctx, dtype=torch.float32),
        placement_of_device=torch.tensor(pl_of_dev, dtype=torch.int64),
        num_devices=m,
        num_placements=len(samples),
    )


def member_predictions(net: CostNet, batch: Packed) -> torch.Tensor:
    """``[M, K, 3]`` each member's log fwd/bwd/comm of the batch's devices."""
    enc = net.encode(batch.x)
    h = torch.zeros(batch.num_devices, net.enc_dim).index_add(0, batch.device_of_table, enc)
    return net.member_device_log_costs(h, batch.ctx)


def weighted_log_loss(
    net: CostNet, batch: Packed, log_dev: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Squared log error of every member on every device, weighted by the member's
    bootstrap weight of the device's placement (``weights`` ``[P, K]``); the all-to-all
    term only where there is one (more than one device)."""
    pred = member_predictions(net, batch)  # [M, K, 3]
    err = F.smooth_l1_loss(
        pred, log_dev.unsqueeze(1).expand_as(pred), reduction="none", beta=HUBER_BETA
    )
    known = torch.ones_like(log_dev, dtype=torch.bool)
    known[:, 2] = log_dev[:, 2] > math.log(EPS_MS)
    w = weights[batch.placement_of_device].unsqueeze(-1) * known.unsqueeze(1)  # [M, K, 3]
    return (err * w).sum() / w.sum().clamp(min=1e-9)


def fit_cost_model(
    net: CostNet,
    samples: Sequence[CostSample],
    epochs: int = 150,
    batch_size: int = 64,
    lr: float = 1e-2,
    seed: int = 0,
    progress: bool = False,
) -> list[float]:
    """Fit ``net`` in place with Adam on the weighted squared log error (each member on
    its own Poisson(1) bootstrap weights of the samples); returns the loss per epoch.

    Args:
        net: the network (trained further from its current weights).
        samples: training samples.
        epochs: passes over the samples.
        batch_size: placements per step.
        lr: Adam learning rate, cosine-decayed to 10%.
        seed: bootstrap weights and shuffling.
        progress: a tqdm bar.
    """
    if not samples:
        raise ValueError("fit_cost_model needs at least one sample")
    rng = np.random.default_rng(seed)
    boot = rng.poisson(1.0, (len(samples), net.members)).astype(np.float32)
    order = rng.permutation(len(samples))
    batches = []
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        chunk = [samples[i] for i in idx]
        dev = np.concatenate([s.dev_ms for s in chunk])
        log_dev = torch.from_numpy(np.log(np.maximum(dev, EPS_MS))).float()
        batches.append((pack(chunk), log_dev, torch.from_numpy(boot[idx])))
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs, eta_min=lr * 0.1)
    epoch_iter = range(epochs)
    if progress:
        from tqdm import tqdm

        epoch_iter = tqdm(epoch_iter, desc="fit cost net", leave=False)
    history = []
    net.train()
    for _ in epoch_iter:
        total = 0.0
        for i in rng.permutation(len(batches)):
            loss = weighted_log_loss(net, *batches[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        sched.step()
        history.append(total / len(batches))
    net.eval()
    return history


@torch.no_grad()
def predict_samples(net: CostNet, samples: Sequence[CostSample]):
    """``(dev_ms [M, 3], step_ms [P], step_log_std [P])``: the ensemble's mean device
    costs, step cost, and the members' spread of log step cost."""
    batch = pack(samples)
    member = member_predictions(net, batch)  # [M, K, 3]
    log_dev = member.mean(1)
    log_tot = torch.logsumexp(log_dev, -1)
    idx = batch.placement_of_device
    step = torch.full((batch.num_placements,), -1e30).scatter_reduce(0, idx, log_tot, "amax")
    m_tot = torch.logsumexp(member, -1)  # [M, K]
    init = torch.full((batch.num_placements, net.members), -1e30)
    m_step = init.scatter_reduce(0, idx.unsqueeze(-1).expand_as(m_tot), m_tot, "amax")
    return torch.exp(log_dev).numpy(), torch.exp(step).numpy(), m_step.std(-1).numpy()
