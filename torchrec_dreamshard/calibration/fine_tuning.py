"""Calibrating: measure a task's kernels within the budget, then fine-tune the cost
network's device heads on them with the bundled weights as the prior (see the package
docstring for the loss), and the model's accuracy on those kernels.
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from torchrec_dreamshard.calibration.kernel_samples import (
    OBSERVED,
    informative_groups,
    load_kernel_samples,
    measure_kernels,
    observed_jobs,
)
from torchrec_dreamshard.calibration.noise import DRIFT_LIMIT, lasting_drift, reference_ms
from torchrec_dreamshard.calibration.store_keys import default_store_path, job_prefix, kernel_job
from torchrec_dreamshard.cost.cost_net import EPS_MS, CostNet
from torchrec_dreamshard.cost.fitting import (
    CostSample,
    bootstrap_weights,
    log_targets,
    pack,
    predict_samples,
    weighted_log_loss,
)
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.spent import spent_on
from torchrec_dreamshard.threads import single_thread

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy import CandidateSource, DreamShard

HEAD_PARAMETERS = ("c_raw", "W_raw", "U_raw", "u", "V_raw")  # fine-tuned; the rest frozen
FIT_RESERVE_S = 3.0  # seconds of the budget kept for fine-tuning


@dataclass(kw_only=True)
class CalibrationConfig:
    """How :func:`calibrate` measures and fine-tunes.

    Args:
        budget_s: seconds for the whole calibration (measuring and fine-tuning); at least
            one batch of kernels is measured whatever the budget.
        store: the SQLite store of calibration kernels (default :func:`default_store_path`).
        measure: the measurement settings (optimizer, precision, device, protocol).
        max_groups: fused groups measured at most, besides the single tables.
        epochs: full-batch Adam steps of the fine-tuning.
        lr: Adam learning rate.
        prior: weight of the pull towards the prior's head weights.
        seed: bootstrap weights.
        progress: a tqdm bar over the kernels to measure.
        measure_missing: measure the kernels the store lacks (``False``: fine-tune on what
            the store holds, measuring nothing, e.g. to rebuild an earlier calibration).
        drift_limit: where kernels are measured, the reference kernel is timed before and
            after; if it moved by more than this (``after / before - 1``, either way), the
            machine was busy: the kernels measured now are discarded from the store and
            not fitted (``inf``: the reference is not timed).
    """

    budget_s: float = 60.0
    store: str | os.PathLike | None = None
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    max_groups: int = 96
    epochs: int = 400
    lr: float = 0.05
    prior: float = 1e-3
    seed: int = 0
    progress: bool = True
    measure_missing: bool = True
    drift_limit: float = DRIFT_LIMIT

    def __post_init__(self) -> None:
        if not (isinstance(self.budget_s, int | float) and math.isfinite(self.budget_s)):
            raise ValueError(f"budget_s must be a finite number of seconds, got {self.budget_s!r}")
        if self.budget_s <= 0:
            raise ValueError(f"budget_s must be > 0 seconds, got {self.budget_s}")
        for name in ("max_groups", "epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if not self.drift_limit > 0:
            raise ValueError(f"drift_limit must be > 0 (inf: off), got {self.drift_limit!r}")
        if not (self.lr > 0 and self.prior >= 0):
            raise ValueError(f"lr must be > 0 and prior >= 0, got {self.lr}, {self.prior}")

    def store_path(self) -> Path:
        return Path(self.store) if self.store is not None else default_store_path()


@dataclass
class CalibrationResult:
    """What :func:`calibrate` did.

    Attributes:
        agent: the calibrated agent (the prior's policy, the fine-tuned cost network).
        measured: kernels measured now.
        reused: kernels found in the store.
        skipped: kernels left unmeasured for lack of budget.
        seconds: wall time of the calibration.
        measure_s: of which measuring.
        samples: the kernels fitted on.
        before: the prior's accuracy on them (``cost/mape``, ``cost/log_std``).
        after: the calibrated model's (in-sample).
        store: the store's path.
        drift: the reference kernel's ``after / before - 1`` around the measuring
            (``None``: not timed, nothing was measured or the check is off).
        discarded: kernels measured now and discarded because the reference drifted
            beyond the config's ``drift_limit`` (the machine was busy).
    """

    agent: DreamShard
    measured: int
    reused: int
    skipped: int
    seconds: float
    measure_s: float
    samples: int
    before: dict[str, float]
    after: dict[str, float]
    store: str
    drift: float | None = None
    discarded: int = 0

    @property
    def note(self) -> str:
        """What the drift check did, for people (``""``: nothing)."""
        if not self.discarded:
            return ""
        return (
            f"the reference kernel drifted {self.drift:+.0%} while calibrating: the machine "
            f"was busy, so the {self.discarded} kernels measured were discarded, not learned "
            "as this machine's speed"
            + ("" if self.samples else "; the checkpoint is used as it is")
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "agent"}

    def lines(self) -> list[str]:
        return [
            f"calibration: {self.measured} kernels measured, {self.reused} reused from "
            f"{self.store}, {self.skipped} skipped (budget) in {self.seconds:.1f}s "
            f"(measuring {self.measure_s:.1f}s)",
            f"  kernel time MAPE on the {self.samples} calibration kernels: "
            f"{self.before.get('cost/mape', float('nan')):.1f}% before, "
            f"{self.after.get('cost/mape', float('nan')):.1f}% after (in-sample)",
            *([f"  {self.note}"] if self.note else []),
        ]


def fine_tune(
    net: CostNet,
    samples: Sequence[CostSample],
    epochs: int = 400,
    lr: float = 0.05,
    prior: float = 1e-3,
    seed: int = 0,
    weights: Sequence[float] | None = None,
) -> CostNet:
    """A copy of ``net`` whose device heads are fitted to ``samples`` with an L2 pull
    towards ``net``'s own head weights (see the package docstring); the encoder is frozen.
    ``weights`` (one per sample, default 1) scale each sample's bootstrap weights.
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
    """Per sample (by its store job key), its weight in the fine-tuning: kernels observed
    in a running job (:data:`~.kernel_samples.OBSERVED`) weigh together as much as every other
    kernel together, at least 1 each: they are the job's own kernels, measured under its
    real load, and few."""
    observed = sum(OBSERVED in g for g in groups)
    if not observed:
        return [1.0] * len(groups)
    heavy = max(1.0, (len(groups) - observed) / observed)
    return [heavy if OBSERVED in g else 1.0 for g in groups]


def _scale_softplus(raw: torch.Tensor, factor: float, floor: float) -> None:
    """Rewrite ``raw`` (in place, a parameter or a view of one) so that ``softplus(raw)``
    is ``factor`` times what it was, at least ``floor``."""
    with torch.no_grad():
        value = (torch.nn.functional.softplus(raw) * float(factor)).clamp(min=floor)
        raw.copy_(value + torch.log(-torch.expm1(-value)))


def scale_comm(net: CostNet, factor: float) -> CostNet:
    """``net`` with its all-to-all head's prediction scaled by ``factor`` (in place)."""
    _scale_softplus(net.comm_raw, factor, 1e-6)
    return net


def with_comm_model(net: CostNet, model: Any, batch_size: int, elem_bytes: int = 4) -> CostNet:
    """``net`` with its all-to-all head set to the machine's fitted all-to-all ``model``
    (:class:`~torchrec_dreamshard.cost.comm_model.CommModel`, what the local backend charges) at
    ``batch_size``: a forward and a backward all-to-all of
    ``latency + per_peer (D - 1) + ms_per_mb * MB``, where a device of pooled width ``w``
    among D devices of total width W moves ``MB = elem_bytes B (W + (D - 2) w) / (D 1e6)``.
    That is the head's own form with ``p = 2 per_peer``, ``r = 2 latency`` and
    ``q = 2 ms_per_mb elem_bytes B / 1000``. The head has no batch input, so the prior
    predicts one all-to-all for every batch size; this fits the task's."""
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


def _all_to_all_model(config: MeasureConfig) -> Any:
    """The machine's all-to-all model for the comm head: ``config``'s file, else the one
    measured on the job's group (while rank 0 drives it), else this machine's cached fit
    or one timed now on ranks that are threads of this process. ``None`` inside a
    distributed job planning without its group and with no cached fit: one rank measures
    nothing there on its own, so the prior's all-to-all head is kept."""
    from torchrec_dreamshard.cost.collective_models import (
        default_collectives_path,
        load_all_to_all_model,
    )
    from torchrec_dreamshard.measure.distributed_job_group import active_group
    from torchrec_dreamshard.measure.spawn import skip_measuring

    path = config.comm_model_path
    keep = "calibration keeps the checkpoint's all-to-all head"
    if path is None and active_group() is None:
        if skip_measuring(default_collectives_path("gloo"), keep):
            return None
    return load_all_to_all_model(path)


def scale_compute(net: CostNet, factors: Sequence[float]) -> CostNet:
    """``net`` with its forward and backward predictions scaled by ``factors`` (in place):
    the device heads' terms are each a softplus of a parameter, summed, so scaling every
    term of an output scales the output."""
    for raw in (net.c_raw, net.W_raw, net.V_raw):
        for out, factor in enumerate(factors):
            _scale_softplus(raw[..., out], factor, 1e-9)
    return net


def stored_observations(config: CalibrationConfig, task: Task) -> int:
    """How many kernels observed in running jobs over ``task``'s tables the store holds
    (this machine, ``config``'s workload at the task's batch)."""
    from torchrec_dreamshard.measure.store import CostStore

    path = config.store_path()
    if not path.exists() or (config.measure.device == "cuda" and not torch.cuda.is_available()):
        return 0  # nothing stored, or a GPU topology planned where there is no GPU
    with CostStore(path) as store:
        prefix = job_prefix(store, config.measure, task.batch_size)
        return len(observed_jobs(store, prefix, task.tables, config.measure, task.batch_size))


@spent_on("calibration")
def calibrate(
    agent: DreamShard,
    task: Task,
    config: CalibrationConfig | None = None,
    sources: Sequence[CandidateSource] | None = None,
) -> CalibrationResult:
    """Measure ``task``'s tables (alone, then informative fused groups) on this machine
    within ``config.budget_s`` and fine-tune ``agent``'s cost network on them.

    Kernels already in the store (same machine, workload and table contents) are reused,
    not measured again, and so are the kernels observed in running jobs over these tables
    (:func:`~.kernel_samples.observed_jobs`: each rank's fused kernel in a DMP job the planner
    observed), the best data there is.

    Args:
        agent: a :class:`~torchrec_dreamshard.policy.DreamShard` (the prior; unchanged).
        task: the task whose tables are measured (at its batch size).
        config: budget, store, measurement and fine-tuning settings.
        sources: the candidate sources of the safe-mode plans whose device groups are
            measured (``None``: the agent's own); the calibrated agent keeps the agent's.

    Returns:
        The calibrated agent and what was measured, reused and skipped.

    Raises:
        ValueError: the store cannot be opened, or another process collects into it.
    """
    from torchrec_dreamshard.measure.store import CostStore
    from torchrec_dreamshard.policy import DreamShard

    config = config or CalibrationConfig()
    start = time.perf_counter()
    deadline = start + config.budget_s - FIT_RESERVE_S
    path = config.store_path()
    if config.store is None:
        path.parent.mkdir(parents=True, exist_ok=True)
    mcfg, B = config.measure, task.batch_size
    with CostStore(path) as store, store.collector_lock("dreamshard calibrate"):
        prefix = job_prefix(store, mcfg, B)
        kernels: dict[str, list[TableSpec]] = {}
        for t in task.tables:
            kernels.setdefault(kernel_job(prefix, [t]), [t])
        for g in informative_groups(agent, task, config.max_groups, sources):
            tables = [task.tables[i] for i in g]
            kernels.setdefault(kernel_job(prefix, tables), tables)
        done = store.done_jobs(prefix)
        todo = [(j, t) for j, t in kernels.items() if j not in done]
        todo = todo if config.measure_missing else []
        check = bool(todo) and math.isfinite(config.drift_limit)
        before = reference_ms(mcfg) if check else None
        measured, measure_s = measure_kernels(store, todo, B, mcfg, deadline, config.progress)
        drift = lasting_drift(before, mcfg, config.drift_limit) if check else None
        discarded = 0
        if drift is not None and abs(drift) > config.drift_limit and measured:
            # measured while the machine changed speed: not this machine's kernels
            discarded = store.forget_jobs([j for j, _ in todo[:measured]])  # not loaded below
        observed = observed_jobs(store, prefix, task.tables, mcfg, B)
        samples = load_kernel_samples(store, set(kernels) | observed, mcfg, B)
    weights = observation_weights([s.group for s in samples])
    net = fine_tune(
        agent.cost_net, samples, config.epochs, config.lr, config.prior, config.seed, weights
    )
    comm = _all_to_all_model(mcfg) if task.num_devices > 1 else None
    if comm is not None:
        net = with_comm_model(net, comm, B)
    meta = dict(agent.meta)
    meta["calibrated"] = {"kernels": len(samples), "budget_s": float(config.budget_s)}
    tuned = DreamShard(net, agent.policy, meta, penalty=agent.penalty, sources=agent.sources)
    return CalibrationResult(
        agent=tuned,
        measured=measured - discarded,
        reused=len(kernels) - len(todo) + len(observed),
        skipped=len(todo) - measured,
        seconds=time.perf_counter() - start,
        measure_s=measure_s,
        samples=len(samples),
        before=kernel_accuracy(agent.cost_net, samples),
        after=kernel_accuracy(net, samples),
        store=str(path),
        drift=drift,
        discarded=discarded,
    )
