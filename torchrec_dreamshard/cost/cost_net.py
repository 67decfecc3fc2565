"""The cost network: exact per-device sums of physical quantities, a learned monotone
fusion correction, and an ensemble whose spread is the uncertainty."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from torchrec_dreamshard.cost.physics import NUM_QUANTITIES, table_quantities
from torchrec_dreamshard.data.tables import NUM_REUSE_BINS, TableSpec, table_features
from torchrec_dreamshard.threads import single_thread  # noqa: F401 (re-exported)

EPS_MS = 1e-3  # ms; floor under measured costs before taking logs
CTX_SCALE = 6.0  # log2(D) / 6: 64 devices -> 1.0
WIDTH_SCALE = 14.0  # log2(1 + W) / 14: total width 16384 -> 1.0
NUM_CTX = 2
NO_COMM_LOG = math.log(1e-6)  # log ms of the communication of a single device (none)
SHAPE_COLUMNS = [0, 1, 3, *range(4, 4 + NUM_REUSE_BINS)]  # table_features minus pooling
NUM_SHAPE = len(SHAPE_COLUMNS)
INPUT_DIM = NUM_SHAPE + NUM_QUANTITIES
MAX_HIDDEN = 4096  # widest encoding a checkpoint may ask for
MAX_MEMBERS = 64  # largest ensemble a checkpoint may ask for


def cost_inputs(tables: Sequence[TableSpec], batch_size: int) -> np.ndarray:
    """``[T, INPUT_DIM]`` float32 inputs ``[s_i, q_i]`` at ``batch_size``, cached per table."""
    if not tables:
        return np.zeros((0, INPUT_DIM), dtype=np.float32)
    rows = [_ROWS.get((t, batch_size)) for t in tables]
    missing = list(dict.fromkeys(t for t, row in zip(tables, rows, strict=True) if row is None))
    if missing:
        if len(_ROWS) + len(missing) > MAX_CACHED_ROWS:
            _ROWS.clear()
        computed = dict(zip(missing, _rows(missing, batch_size), strict=True))
        _ROWS.update({(t, batch_size): row for t, row in computed.items()})
        rows = [computed[t] if row is None else row for t, row in zip(tables, rows, strict=True)]
    return np.stack(rows)


MAX_CACHED_ROWS = 1 << 16  # tables x batch sizes whose cost inputs are kept
_ROWS: dict[tuple[TableSpec, int], np.ndarray] = {}


def _rows(tables: Sequence[TableSpec], batch_size: int) -> np.ndarray:
    shape = table_features(tables, batch_size)[:, SHAPE_COLUMNS]
    rows = np.concatenate([shape, table_quantities(tables, batch_size)], axis=1)
    rows = rows.astype(np.float32)
    rows.flags.writeable = False
    return rows


def context_values(num_devices: int, total_dim: int) -> list[float]:
    """The task context ``[log2(D) / 6, log2(1 + W) / 14]``."""
    return [math.log2(num_devices) / CTX_SCALE, math.log2(1 + total_dim) / WIDTH_SCALE]


def device_context(num_devices: int, total_dim: int) -> torch.Tensor:
    """The task context as a ``[NUM_CTX]`` float tensor."""
    return torch.tensor(context_values(num_devices, total_dim), dtype=torch.float32)


def mlp(sizes: Sequence[int], last_relu: bool = False) -> nn.Sequential:
    """Linear layers with ReLU between them (and after the last when ``last_relu``)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _param(*shape: int, scale: float) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape) * scale)


class CostNet(nn.Module):
    """An ensemble of physical-plus-monotone-fusion cost models. Member ``k``, for a table
    of shape features ``s_i`` and physical quantities ``q_i``:

        e_i = relu(A_k^+ log(1 + q_i) + g_k(s_i))
        (f_d, b_d) = c_k + W_k^+ Q_d + V_k^+ relu(U_k^+ log(1 + H_d) + u_k)

    with ``Q_d = sum q_i``, ``H_d = sum e_i`` over the device's tables and every ``+``
    weight softplus-positive (adding a table never lowers a time); all-to-all
    ``m_d = p (D - 1) + q (W + (D - 2) w_d) / (1000 D) + r``; ``log step = max_d log(f_d +
    b_d + m_d)``. A device state is ``[Q_d, H_d^1, ..., H_d^K, w_d / 256]``.

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
        self.enc_dim = self.state_width(hidden, members)
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

    # the integer config entries it is built from, each with its largest allowed value
    CONFIG_LIMITS: ClassVar[dict[str, int]] = {"hidden": MAX_HIDDEN, "members": MAX_MEMBERS}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> CostNet:
        """The network a config describes (:meth:`config`; a checkpoint's metadata)."""
        return cls(config["hidden"], config["members"])

    def config(self) -> dict[str, Any]:
        """What :meth:`from_config` builds this network's shape from."""
        return {"hidden": self.hidden, "members": self.members}

    @staticmethod
    def state_width(hidden: int, members: int) -> int:
        """Width of a device state ``[Q_d, H_d^1..H_d^K, w_d / 256]``."""
        return NUM_QUANTITIES + members * hidden + 1

    # -- tables ---------------------------------------------------------------------------

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, enc_dim]`` encodings ``[q_i, e_i^1..e_i^K, dim_i / 256]`` of inputs ``x``."""
        shape, q = x[:, :NUM_SHAPE], x[:, NUM_SHAPE:]
        hid = torch.relu(torch.einsum("ts,ksh->kth", shape, self.g1) + self.g1_b)
        g = torch.einsum("kth,khj->ktj", hid, self.g2) + self.g2_b
        e = torch.relu(torch.einsum("tq,kqh->kth", torch.log1p(q), F.softplus(self.A_raw)) + g)
        width = torch.exp2(shape[:, 0:1] * 8.0) / 256.0
        return torch.cat([q, e.permute(1, 0, 2).reshape(len(x), -1), width], dim=-1)

    # -- devices --------------------------------------------------------------------------

    def member_compute(self, S: torch.Tensor) -> torch.Tensor:
        """``[..., K, 2]`` each member's forward and backward ms of states ``S``."""
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
        """Log all-to-all ms of a device of width ``w`` among D devices of width W."""
        D = torch.exp2(ctx[..., 0] * CTX_SCALE)
        W = torch.exp2(ctx[..., 1] * WIDTH_SCALE) - 1.0
        p, q, r = F.softplus(self.comm_raw)
        load = (W + (D - 2.0) * width).clamp(min=0.0) / (1000.0 * D)
        log_m = torch.log(p * (D - 1.0) + q * load + r)
        return torch.where(D > 1.5, log_m, torch.full_like(log_m, NO_COMM_LOG))

    def member_device_log_costs(self, S: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """``[..., K, 3]`` each member's log fwd/bwd/comm ms."""
        c = ctx.expand(*S.shape[:-1], ctx.shape[-1])
        log_fb = torch.log(self.member_compute(S))
        comm = self.log_comm(S[..., -1] * 256.0, c).unsqueeze(-1).unsqueeze(-1)
        return torch.cat([log_fb, comm.expand(*log_fb.shape[:-1], 1)], dim=-1)

    def device_log_costs(self, h: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """``[..., 3]`` log fwd/bwd/comm (ms): the members' mean in log space."""
        return self.member_device_log_costs(h, ctx).mean(dim=-2)

    # -- placements -----------------------------------------------------------------------

    def overall_log_cost(
        self, h: torch.Tensor, log_dev: torch.Tensor, occupied: torch.Tensor
    ) -> torch.Tensor:
        """``[...]`` log step cost: max over occupied devices of ``log t_d`` (``h`` unused)."""
        log_total = torch.logsumexp(log_dev, dim=-1)
        return log_total.masked_fill(~occupied, torch.finfo(log_total.dtype).min).amax(-1)


class FrozenHeads:
    """A :class:`CostNet`'s device heads with its weights frozen (softplus and context terms
    computed once, values bit for bit the network's), for planning; no gradient flows.

    Args:
        ctx: the task context (:func:`device_context`).
    """

    def __init__(self, net: CostNet, ctx: torch.Tensor):
        K, Q = net.members, NUM_QUANTITIES
        with torch.no_grad():
            # [1, Q, 2K]: the right operand einsum builds for "...q,kqo->...ko"
            self.W = F.softplus(net.W_raw).permute(1, 0, 2).reshape(1, Q, 2 * K)
            self.U, self.V = F.softplus(net.U_raw), F.softplus(net.V_raw)
            self.c, self.u = F.softplus(net.c_raw), net.u.clone()  # u: [K, 1, h]
            self.pqr = F.softplus(net.comm_raw)
        self.members, self.hidden, self.ctx = K, net.hidden, ctx
        self._comm_terms: dict[tuple[int, ...], tuple] = {}

    def member_compute(self, S: torch.Tensor) -> torch.Tensor:
        """:meth:`CostNet.member_compute`, member-major between the two ``bmm``."""
        K, h, Q = self.members, self.hidden, NUM_QUANTITIES
        lead = S.shape[:-1]
        phys = torch.bmm(S[..., :Q].reshape(1, -1, Q), self.W).view(*lead, K, 2)
        log_h = torch.log1p(S[..., Q : Q + K * h].reshape(-1, K, h))
        z = torch.relu(torch.bmm(log_h.transpose(0, 1), self.U) + self.u)
        fusion = torch.bmm(z, self.V).transpose(0, 1).reshape(*lead, K, 2)
        return self.c + phys + fusion

    def log_comm(self, width: torch.Tensor | np.ndarray) -> torch.Tensor:
        """:meth:`CostNet.log_comm` of devices of pooled widths ``width``."""
        W, D_less_2, scale, peers, q, r, several = self._comm(tuple(width.shape))
        width = width.numpy() if isinstance(width, torch.Tensor) else np.asarray(width)
        load = np.maximum(W + D_less_2 * width, 0.0) / scale
        log_m = torch.log(torch.from_numpy(np.asarray(peers + q * load + r)))
        return log_m if several is None else torch.where(several, log_m, NO_COMM_LOG)

    def _comm(self, lead: tuple[int, ...]) -> tuple:
        """The context-only all-to-all terms for states ``[*lead, enc_dim]`` (cached per shape)."""
        if lead not in self._comm_terms:
            c = self.ctx.expand(*lead, self.ctx.shape[-1])
            D = torch.exp2(c[..., 0] * CTX_SCALE)
            W = torch.exp2(c[..., 1] * WIDTH_SCALE) - 1.0
            p, q, r = self.pqr
            several = D > 1.5
            mask = None if bool(several.all()) else several
            terms = (W, D - 2.0, 1000.0 * D, p * (D - 1.0), q, r)
            self._comm_terms[lead] = (*(t.numpy() for t in terms), mask)
        return self._comm_terms[lead]

    def member_device_log_costs(self, S: torch.Tensor) -> torch.Tensor:
        """:meth:`CostNet.member_device_log_costs`, in this context."""
        log_fb = torch.log(self.member_compute(S))
        comm = self.log_comm(S.numpy()[..., -1] * np.float32(256.0)).unsqueeze(-1).unsqueeze(-1)
        return torch.cat([log_fb, comm.expand(*log_fb.shape[:-1], 1)], dim=-1)

    def device_log_costs(self, S: torch.Tensor) -> torch.Tensor:
        """:meth:`CostNet.device_log_costs`, in this context."""
        return self.member_device_log_costs(S).mean(dim=-2)
