"""Fitting the cost network to measurements (a bootstrap-weighted Huber error of log device
times per member), and its accuracy metrics."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from torchrec_dreamshard.cost.cost_net import EPS_MS, CostNet, context_values, cost_inputs
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.threads import single_thread

HUBER_BETA = 0.1  # log-error beyond which the loss grows linearly (robust to timing spikes)


@dataclass
class CostSample:
    """One measured placement (or one measured fused kernel, as a 1-device placement).

    Attributes:
        group: the task it belongs to (held-out splits, per-task rank metrics).
        inputs: ``[T, INPUT_DIM]`` (:func:`cost_inputs`).
        devices: table indices per non-empty device.
        dev_ms: ``[M, 3]`` measured fwd/bwd/comm per non-empty device (ms).
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
    """A :class:`CostSample` from ``per_device`` ``(fwd, bwd, comm)`` ms, empty devices included."""
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
    """Bootstrap-weighted (``[P, K]``) Huber error of log costs, every member on every device;
    the all-to-all term counts only on more than one device."""
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
    """Fit ``net`` in place with Adam on the bootstrap-weighted Huber error of log costs.

    Args:
        net: the network (trained further from its current weights).
        batch_size: placements per step.
        lr: Adam learning rate, cosine-decayed to 10%.
        progress: a tqdm bar.

    Returns:
        The loss per epoch.
    """
    if not samples:
        raise ValueError("fit_cost_model needs at least one sample")
    with single_thread():
        return _fit(net, samples, epochs, batch_size, lr, seed, progress)


def log_targets(samples: Sequence[CostSample]) -> torch.Tensor:
    """``[M, 3]`` log measured fwd/bwd/comm ms (floored at ``EPS_MS``), in :func:`pack` order."""
    dev = np.concatenate([s.dev_ms for s in samples])
    return torch.from_numpy(np.log(np.maximum(dev, EPS_MS))).float()


def bootstrap_weights(rng: np.random.Generator, num_samples: int, members: int) -> torch.Tensor:
    """``[num_samples, members]`` Poisson(1) weights: each member's bootstrap re-weighting."""
    return torch.from_numpy(rng.poisson(1.0, (num_samples, members)).astype(np.float32))


def _fit(net, samples, epochs, batch_size, lr, seed, progress) -> list[float]:
    rng = np.random.default_rng(seed)
    boot = bootstrap_weights(rng, len(samples), net.members)
    order = rng.permutation(len(samples))
    batches = []
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        chunk = [samples[i] for i in idx]
        batches.append((pack(chunk), log_targets(chunk), boot[idx]))
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
    """``(dev_ms [M, 3], step_ms [P], step_log_std [P])`` of the ensemble."""
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


def mape(pred: np.ndarray, true: np.ndarray) -> float:
    """Mean absolute percentage error, in percent."""
    pred, true = np.asarray(pred, float), np.asarray(true, float)
    return float(np.mean(np.abs(pred - true) / np.maximum(np.abs(true), EPS_MS)) * 100.0)


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-a between two equally long sequences (nan for fewer than 2)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    n = len(a)
    if n < 2:
        return float("nan")
    i, j = np.triu_indices(n, k=1)
    s = np.sign(a[i] - a[j]) * np.sign(b[i] - b[j])
    return float(s.sum() / len(i))


def evaluate_cost_model(net: CostNet, samples: Sequence[CostSample]) -> dict[str, float]:
    """Held-out MAPE of device and step costs, mean per-task Kendall tau (groups of 3 or
    more) and mean spread of log step cost."""
    if not samples:
        return {}
    dev_pred, step_pred, spread = predict_samples(net, samples)
    dev_true = np.concatenate([s.dev_ms for s in samples])
    step_true = np.array([s.step_ms for s in samples])
    out = {
        "cost/device_total_mape": mape(dev_pred.sum(1), dev_true.sum(1)),
        "cost/mape": mape(step_pred, step_true),
        "cost/log_std": float(np.mean(spread)),
    }
    taus = []
    for g in sorted({s.group for s in samples}):
        idx = [k for k, s in enumerate(samples) if s.group == g]
        if len(idx) >= 3:
            taus.append(kendall_tau(step_pred[idx], step_true[idx]))
    out["cost/kendall_tau"] = float(np.nanmean(taus)) if taus else float("nan")
    return out
