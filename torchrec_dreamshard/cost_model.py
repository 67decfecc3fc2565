"""The cost network: a placement's per-device and overall step cost, learned from
measurements.

Model. Each table ``i`` has the fixed feature vector ``x_i`` of
:func:`torchrec_dreamshard.tables.table_features`, extended with four linear-scale values
recovered from it (dim / 256, pooling / 100, dim x pooling / 2560, bytes / 1e8). A shared
MLP encodes it, and one exact channel carries its width:
``e_i = [phi(x_i), dim_i / 256]`` (non-negative: ReLU output). A device ``d`` holding the
set of tables ``S_d`` is represented by the **sum** of its tables' encodings,

    h_d = sum_{i in S_d} e_i,

so its prediction cannot depend on the order of its tables. With the task context
``c = (log2(D) / 6, log2(1 + W) / 14)`` (D devices, total pooled width
``W = sum_i dim_i``), the compute heads read ``[log(1 + h_d), c]`` and the all-to-all
head has the latency-bandwidth form of a collective, with the device's exact width
``w_d = 256 h_d[-1]``:

    (log f_d, log b_d) = psi([log(1 + h_d), c]),
    m_d = p (D - 1) + q (W + (D - 2) w_d) / (1000 D) + r   (p, q, r >= 0; 0 if D = 1),
    t_d = f_d + b_d + m_d

(``(W + (D - 2) w_d) / D`` is what a device sends plus receives per sample under
table-wise sharding: its own outputs to D - 1 peers, its 1/D of everyone else's back).

The overall head reads the **max over devices** of ``z_d = [log(1 + h_d), log t_d]`` and
adds a learned correction to the largest device total:

    log step = max_d log t_d + rho(max_d z_d),

so the step cost is invariant to the order of devices and, with ``rho`` small at
initialisation, starts from the physical ``max_d t_d``. Empty devices are skipped (their
cost is zero). Both sum and max make the network work for any number of tables and
devices.

Fitting it to measurements, and its metrics, are in :mod:`torchrec_dreamshard.cost_fit`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from torchrec_dreamshard.tables import (
    BYTES_LOG10_SCALE,
    DIM_LOG2_SCALE,
    FEATURE_DIM,
    POOLING_LOG10_SCALE,
)
from torchrec_dreamshard.threads import single_thread  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from torchrec_dreamshard.cost_fit import PackedBatch

EPS_MS = 1e-3  # ms; floor under measured costs before taking logs
CTX_SCALE = 6.0  # log2(D) / 6: 64 devices -> 1.0
WIDTH_SCALE = 14.0  # log2(1 + W) / 14: total width 16384 -> 1.0
NUM_CTX = 2
NUM_DERIVED = 4  # linear-scale channels the encoder gets besides the features
NO_COMM_LOG = math.log(1e-6)  # log ms of the communication of a single device (none)


def mlp(sizes: Sequence[int], last_relu: bool = False) -> nn.Sequential:
    """Linear layers with ReLU between them (and after the last when ``last_relu``)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def context_values(num_devices: int, total_dim: int) -> list[float]:
    """The task context ``[log2(D) / 6, log2(1 + W) / 14]``."""
    return [math.log2(num_devices) / CTX_SCALE, math.log2(1 + total_dim) / WIDTH_SCALE]


def device_context(num_devices: int, total_dim: int) -> torch.Tensor:
    """The task context as a ``[NUM_CTX]`` float tensor."""
    return torch.tensor(context_values(num_devices, total_dim), dtype=torch.float32)


def derived_features(x: torch.Tensor) -> torch.Tensor:
    """The features plus linear-scale dim / 256, pooling / 100, dim x pooling / 2560 and
    bytes / 1e8, recovered from the fixed log normalisation (so the sum over a device's
    tables carries its total width and lookups exactly)."""
    dim = torch.exp2(x[..., 0:1] * DIM_LOG2_SCALE)
    pooling = torch.pow(10.0, x[..., 2:3] * POOLING_LOG10_SCALE) - 1.0
    size = torch.pow(10.0, x[..., 3:4] * BYTES_LOG10_SCALE - 8.0)  # bytes / 1e8
    return torch.cat([x, dim / 256, pooling / 100, dim * pooling / 2560, size], dim=-1)


class CostNet(nn.Module):
    """Per-table encoder, sum-per-device cost heads, max-over-devices overall head.

    Args:
        hidden: width of the encoder and the heads.
        feature_dim: table feature size.
    """

    def __init__(self, hidden: int = 64, feature_dim: int = FEATURE_DIM):
        super().__init__()
        self.hidden = hidden
        self.feature_dim = feature_dim
        self.encoder = mlp([feature_dim + NUM_DERIVED, hidden, hidden - 1], last_relu=True)
        self.device_head = mlp([hidden + NUM_CTX, hidden, hidden, 2])
        # all-to-all constants (ms per peer, ms per kilo-dim of load, ms), softplus^-1
        self.comm_raw = nn.Parameter(torch.tensor([1.0, 5.0, -2.0]))
        self.overall_head = mlp([hidden + 1, hidden, 1])
        with torch.no_grad():  # start the overall correction at ~0
            self.overall_head[-1].weight.mul_(0.01)
            self.overall_head[-1].bias.zero_()

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Table encodings ``e_i = [phi(x_i), dim_i / 256]``, ``[..., hidden]`` (the last
        channel is exact, so a device's sum carries its pooled width)."""
        d = derived_features(x)
        return torch.cat([self.encoder(d), d[..., self.feature_dim : self.feature_dim + 1]], -1)

    def device_log_costs(self, h: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """``[..., 3]`` log fwd/bwd/comm (ms) from device sums ``h`` ``[..., hidden]`` and
        the context ``ctx`` ``[..., NUM_CTX]`` (broadcast to ``h``'s leading shape)."""
        c = ctx.expand(*h.shape[:-1], ctx.shape[-1])
        compute = self.device_head(torch.cat([torch.log1p(h), c], dim=-1))
        return torch.cat([compute, self.log_comm(h[..., -1] * 256.0, c).unsqueeze(-1)], -1)

    def log_comm(self, width: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """Log all-to-all ms of a device of pooled width ``w`` among D devices of total
        width W: ``m = p (D - 1) + q L + r``, ``L = (W + (D - 2) w) / (1000 D)`` (the
        kilo-dims per sample it sends plus receives), ``p, q, r >= 0`` learned; none for
        one device."""
        D = torch.exp2(ctx[..., 0] * CTX_SCALE)
        W = torch.exp2(ctx[..., 1] * WIDTH_SCALE) - 1.0
        p, q, r = F.softplus(self.comm_raw)
        load = (W + (D - 2.0) * width).clamp(min=0.0) / (1000.0 * D)
        log_m = torch.log(p * (D - 1.0) + q * load + r)
        return torch.where(D > 1.5, log_m, torch.full_like(log_m, NO_COMM_LOG))

    def device_z(self, h: torch.Tensor, log_total: torch.Tensor) -> torch.Tensor:
        """What the overall head max-reduces: ``z_d = [log(1 + h_d), log t_d]``."""
        return torch.cat([torch.log1p(h), log_total.unsqueeze(-1)], dim=-1)

    def overall_from_max(self, zmax: torch.Tensor) -> torch.Tensor:
        """``log step = max_d log t_d + rho(max_d z_d)``."""
        return zmax[..., -1] + self.overall_head(zmax).squeeze(-1)

    def overall_log_cost(
        self, h: torch.Tensor, log_dev: torch.Tensor, occupied: torch.Tensor
    ) -> torch.Tensor:
        """Log step cost from a dense state.

        Args:
            h: device sums ``[..., D, hidden]``.
            log_dev: ``[..., D, 3]`` from :meth:`device_log_costs`.
            occupied: ``[..., D]`` bool, devices holding at least one table.

        Returns:
            ``[...]`` log step cost in ms.
        """
        log_total = torch.logsumexp(log_dev, dim=-1)
        z = self.device_z(h, log_total)
        neg = torch.finfo(z.dtype).min
        z = z.masked_fill(~occupied.unsqueeze(-1), neg)
        return self.overall_from_max(z.max(dim=-2).values)

    def forward_packed(self, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictions on a packed batch of placements.

        Returns:
            ``(log_dev [M, 3], log_step [P])`` for the M non-empty devices and the P
            placements of the batch.
        """
        enc = self.encode(batch.x)
        h = torch.zeros(batch.num_devices, self.hidden, dtype=enc.dtype)
        h = h.index_add(0, batch.device_of_table, enc)
        log_dev = self.device_log_costs(h, batch.ctx)
        log_total = torch.logsumexp(log_dev, dim=-1)
        z = self.device_z(h, log_total)
        idx = batch.placement_of_device.unsqueeze(-1).expand_as(z)
        init = torch.full((batch.num_placements, z.shape[-1]), -1e30, dtype=z.dtype)
        zmax = init.scatter_reduce(0, idx, z, reduce="amax", include_self=True)
        log_step = self.overall_from_max(zmax)
        return log_dev, log_step
