"""Fitting the cost network to measurements, and its accuracy metrics.

Samples. A measured placement (or a measured fused kernel, as a one-device placement) is a
:class:`CostSample`; several are packed into one :class:`PackedBatch` so the network rates
them in one call (:meth:`~torchrec_dreamshard.cost_model.CostNet.forward_packed`).

Loss. Squared error of logarithms, ``mean((log y_hat - log y)^2)``, for the three device
heads (communication left out on one device, where there is none) and the overall head.
It is a relative error (``exp`` of the RMS is the typical ratio between prediction and
measurement), so a 0.05 ms table and a 50 ms device weigh the same: the placement
decisions hinge on the relative cost of small tables as much as of big ones, and a
squared error in milliseconds would fit only the biggest devices. It is also symmetric in
over- and under-prediction, unlike MAPE, and smooth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from torchrec_dreamshard.cost_model import EPS_MS, CostNet, context_values, single_thread
from torchrec_dreamshard.tables import TableSpec, table_features


@dataclass
class PackedBatch:
    """Several placements' devices flattened for one network call.

    Attributes:
        x: features of every (device, table) pair, ``[N, F]``.
        device_of_table: the row in the device list of each feature row, ``[N]``.
        ctx: task context per device, ``[M, NUM_CTX]``.
        placement_of_device: the placement each device belongs to, ``[M]``.
        num_devices: M.
        num_placements: P.
    """

    x: torch.Tensor
    device_of_table: torch.Tensor
    ctx: torch.Tensor
    placement_of_device: torch.Tensor
    num_devices: int
    num_placements: int


def pack(
    placements: Sequence[tuple[np.ndarray, Sequence[Sequence[int]], list[float]]],
) -> PackedBatch:
    """Pack placements for :meth:`CostNet.forward_packed`.

    Args:
        placements: per placement, ``(features [T, F], tables per non-empty device (index
            lists into the features), context values)``. Empty devices must be left out.
    """
    xs, dev_of_tab, ctx, pl_of_dev = [], [], [], []
    m = 0
    for p, (feats, devices, context) in enumerate(placements):
        for tables in devices:
            if len(tables) == 0:
                raise ValueError("pack() takes non-empty devices only")
            xs.append(feats[np.asarray(tables, dtype=np.int64)])
            dev_of_tab.append(np.full(len(tables), m, dtype=np.int64))
            ctx.append(context)
            pl_of_dev.append(p)
            m += 1
    return PackedBatch(
        x=torch.from_numpy(np.concatenate(xs).astype(np.float32)),
        device_of_table=torch.from_numpy(np.concatenate(dev_of_tab)),
        ctx=torch.tensor(ctx, dtype=torch.float32),
        placement_of_device=torch.tensor(pl_of_dev, dtype=torch.int64),
        num_devices=m,
        num_placements=len(placements),
    )


# ----------------------------------------------------------------------------------------
# The training data the network sees
# ----------------------------------------------------------------------------------------


@dataclass
class CostSample:
    """One measured placement (or one measured fused kernel, as a 1-device placement).

    Attributes:
        group: the task it belongs to (for held-out splits and per-task rank metrics).
        features: ``[T, F]`` table features.
        devices: table indices per non-empty device.
        context: the task context (:func:`context_values`).
        dev_ms: ``[M, 3]`` measured fwd/bwd/comm per non-empty device (ms).
        step_ms: measured step cost (ms), or ``nan`` when only device costs are known.
    """

    group: str
    features: np.ndarray
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
    step_ms: float,
) -> CostSample:
    """A :class:`CostSample` from a measured placement (``per_device`` lists
    ``(fwd, bwd, comm)`` ms for every device, empty ones included)."""
    feats = table_features(tables, batch_size)
    devices = [[i for i, p in enumerate(placement) if p == d] for d in range(num_devices)]
    keep = [d for d in range(num_devices) if devices[d]]
    dev_ms = np.asarray([per_device[d] for d in keep], dtype=np.float64).reshape(-1, 3)
    context = context_values(num_devices, sum(t.dim for t in tables))
    return CostSample(group, feats, [devices[d] for d in keep], context, dev_ms, step_ms)


# ----------------------------------------------------------------------------------------
# Fitting and metrics
# ----------------------------------------------------------------------------------------


def _targets(samples: Sequence[CostSample]) -> tuple[torch.Tensor, torch.Tensor]:
    dev = np.concatenate([s.dev_ms for s in samples])
    step = np.array([s.step_ms for s in samples], dtype=np.float64)
    log_dev = torch.from_numpy(np.log(np.maximum(dev, EPS_MS))).float()
    log_step = torch.from_numpy(np.log(np.maximum(step, EPS_MS))).float()
    return log_dev, log_step


def log_mse_loss(
    net: CostNet, batch: PackedBatch, log_dev: torch.Tensor, log_step: torch.Tensor
) -> torch.Tensor:
    """Squared log error of the device heads plus that of the overall head (where the
    step cost was measured, i.e. not ``nan``)."""
    pred_dev, pred_step = net.forward_packed(batch)
    err = (pred_dev - log_dev) ** 2
    known = torch.ones_like(err, dtype=torch.bool)
    known[:, 2] = log_dev[:, 2] > math.log(EPS_MS)  # no all-to-all on one device
    loss = err[known].mean()
    known = torch.isfinite(log_step)
    if known.any():
        loss = loss + ((pred_step[known] - log_step[known]) ** 2).mean()
    return loss


def fit_cost_model(
    net: CostNet,
    samples: Sequence[CostSample],
    epochs: int = 200,
    batch_size: int = 64,
    lr: float = 3e-3,
    weight_decay: float = 1e-5,
    seed: int = 0,
    progress: bool = False,
) -> list[float]:
    """Fit ``net`` in place with Adam on the squared log error; returns the loss per epoch.

    Args:
        net: the network (trained further from its current weights).
        samples: training samples.
        epochs: passes over the samples.
        batch_size: placements per step.
        lr: Adam learning rate (cosine-decayed to 10% over the epochs; ten times more for
            the three all-to-all constants).
        weight_decay: Adam weight decay.
        seed: shuffling seed.
        progress: show a tqdm bar.
    """
    if not samples:
        raise ValueError("fit_cost_model needs at least one sample")
    with single_thread():
        return _fit(net, samples, epochs, batch_size, lr, weight_decay, seed, progress)


def _fit(net, samples, epochs, batch_size, lr, weight_decay, seed, progress) -> list[float]:
    rng = np.random.default_rng(seed)
    comm = [net.comm_raw]
    rest = [p for n, p in net.named_parameters() if n != "comm_raw"]
    opt = torch.optim.Adam(
        [{"params": rest}, {"params": comm, "lr": lr * 10, "weight_decay": 0.0}],
        lr=lr,
        weight_decay=weight_decay,
    )
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs, eta_min=lr * 0.1)
    batches = _fixed_batches(samples, batch_size, rng)
    history = []
    epoch_iter = range(epochs)
    if progress:
        from tqdm import tqdm

        epoch_iter = tqdm(epoch_iter, desc="fit cost net", leave=False)
    net.train()
    for _ in epoch_iter:
        total = 0.0
        for i in rng.permutation(len(batches)):
            packed, log_dev, log_step = batches[i]
            loss = log_mse_loss(net, packed, log_dev, log_step)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        sched.step()
        history.append(total / len(batches))
    net.eval()
    return history


def _fixed_batches(samples: Sequence[CostSample], batch_size: int, rng: np.random.Generator):
    """Pre-packed mini-batches (packing once keeps the epochs cheap)."""
    order = rng.permutation(len(samples))
    out = []
    for start in range(0, len(order), batch_size):
        chunk = [samples[i] for i in order[start : start + batch_size]]
        packed = pack([(s.features, s.devices, s.context) for s in chunk])
        out.append((packed, *_targets(chunk)))
    return out


@torch.no_grad()
def predict_samples(net: CostNet, samples: Sequence[CostSample]) -> tuple[np.ndarray, np.ndarray]:
    """``(dev_ms [M, 3], step_ms [P])`` predicted for ``samples``."""
    packed = pack([(s.features, s.devices, s.context) for s in samples])
    log_dev, log_step = net.forward_packed(packed)
    return torch.exp(log_dev).numpy(), torch.exp(log_step).numpy()


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
    """Held-out accuracy: MAPE of step and device costs, and the mean Kendall tau between
    predicted and measured step cost over placements of the same task."""
    with_step = [s for s in samples if math.isfinite(s.step_ms)]
    out: dict[str, float] = {}
    if samples:
        dev_pred, _ = predict_samples(net, samples)
        dev_true = np.concatenate([s.dev_ms for s in samples])
        out["cost/device_total_mape"] = mape(dev_pred.sum(1), dev_true.sum(1))
    if with_step:
        _, step_pred = predict_samples(net, with_step)
        step_true = np.array([s.step_ms for s in with_step])
        out["cost/mape"] = mape(step_pred, step_true)
        taus = []
        for g in sorted({s.group for s in with_step}):
            idx = [k for k, s in enumerate(with_step) if s.group == g]
            if len(idx) >= 3:
                taus.append(kendall_tau(step_pred[idx], step_true[idx]))
        out["cost/kendall_tau"] = float(np.nanmean(taus)) if taus else float("nan")
    return out
