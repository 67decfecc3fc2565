"""Fitting the cost network's device heads to measured kernels (:func:`fine_tune`), and
setting or scaling the heads' outputs."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from torchrec_dreamshard.calibration.kernel_samples import OBSERVED
from torchrec_dreamshard.cost.cost_net import EPS_MS, CostNet
from torchrec_dreamshard.cost.fitting import (
    CostSample,
    bootstrap_weights,
    log_targets,
    pack,
    predict_samples,
    weighted_log_loss,
)
from torchrec_dreamshard.threads import single_thread

HEAD_PARAMETERS = ("c_raw", "W_raw", "U_raw", "u", "V_raw")  # fine-tuned; the rest frozen


def fine_tune(
    net: CostNet,
    samples: Sequence[CostSample],
    epochs: int = 400,
    lr: float = 0.05,
    prior: float = 1e-3,
    seed: int = 0,
    weights: Sequence[float] | None = None,
) -> CostNet:
    """A copy of ``net`` with its device heads fitted to ``samples``, the encoder frozen.

    Each member ``k`` minimises ``sum_s w_ks huber(log pred_k(s) - log meas(s)) / sum w +
    prior * mean_p (theta_p - theta_p^0)^2``, ``w_ks`` Poisson(1) bootstrap weights scaled
    by ``weights``.
    """
    tuned = copy.deepcopy(net)
    if not samples or epochs == 0:
        return tuned.eval()
    heads = [p for n, p in tuned.named_parameters() if n in HEAD_PARAMETERS]
    anchors = [p.detach().clone() for p in heads]
    for n, p in tuned.named_parameters():
        p.requires_grad_(n in HEAD_PARAMETERS)
    rng = np.random.default_rng(seed)
    boot = bootstrap_weights(rng, len(samples), net.members)
    boot[:, 0] = 1.0  # one member sees every sample once
    if weights is not None:
        boot = boot * torch.tensor(list(weights), dtype=boot.dtype)[:, None]
    batch = pack(samples)
    log_dev = log_targets(samples)
    opt = torch.optim.Adam(heads, lr=lr)
    numel = sum(p.numel() for p in heads)
    with single_thread():
        tuned.train()
        for _ in range(epochs):
            loss = weighted_log_loss(tuned, batch, log_dev, boot)
            pull = sum(((p - a) ** 2).sum() for p, a in zip(heads, anchors, strict=True))
            loss = loss + prior * pull / numel
            opt.zero_grad()
            loss.backward()
            opt.step()
    for p in tuned.parameters():
        p.requires_grad_(True)
    return tuned.eval()


def observation_weights(groups: Sequence[str]) -> list[float]:
    """Per sample, its fine-tuning weight: kernels observed in a running job weigh together
    as much as all the others, at least 1 each."""
    observed = sum(OBSERVED in g for g in groups)
    if not observed:
        return [1.0] * len(groups)
    heavy = max(1.0, (len(groups) - observed) / observed)
    return [heavy if OBSERVED in g else 1.0 for g in groups]


def _scale_softplus(raw: torch.Tensor, factor: float, floor: float) -> None:
    """Scale ``softplus(raw)`` by ``factor`` in place, at least ``floor``."""
    with torch.no_grad():
        value = (torch.nn.functional.softplus(raw) * float(factor)).clamp(min=floor)
        raw.copy_(value + torch.log(-torch.expm1(-value)))


def scale_comm(net: CostNet, factor: float) -> CostNet:
    """``net`` with its all-to-all head's prediction scaled by ``factor`` (in place)."""
    _scale_softplus(net.comm_raw, factor, 1e-6)
    return net


def with_comm_model(net: CostNet, model: Any, batch_size: int, elem_bytes: int = 4) -> CostNet:
    """``net`` with its all-to-all head set to ``model`` at ``batch_size`` (in place)."""
    p = 2.0 * model.per_peer_ms
    q = 2.0 * model.ms_per_mb * elem_bytes * batch_size / 1000.0
    r = 2.0 * model.latency_ms
    target = torch.tensor([p, q, r], dtype=torch.float64).clamp(min=1e-6)
    raw = target + torch.log(-torch.expm1(-target))  # softplus^-1, stable for small and large
    with torch.no_grad():
        net.comm_raw.copy_(raw.to(net.comm_raw.dtype))
    return net


def kernel_accuracy(net: CostNet, samples: Sequence[CostSample]) -> dict[str, float]:
    """MAPE (%) of the predicted fwd + bwd of the kernels and the members' mean spread."""
    if not samples:
        return {}
    with torch.no_grad(), single_thread():
        _, step, spread = predict_samples(net, samples)
    true = np.array([s.step_ms for s in samples])
    mape = float(np.mean(np.abs(step - true) / np.maximum(true, EPS_MS)) * 100)
    return {"cost/mape": mape, "cost/log_std": float(np.mean(spread))}


def scale_compute(net: CostNet, factors: Sequence[float]) -> CostNet:
    """``net`` with its forward and backward predictions scaled by ``factors`` (in place)."""
    for raw in (net.c_raw, net.W_raw, net.V_raw):
        for out, factor in enumerate(factors):
            _scale_softplus(raw[..., out], factor, 1e-9)
    return net
