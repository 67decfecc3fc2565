"""Calibrating (:func:`calibrate`): measure a task's kernels within the budget, then fine-tune
the cost network's device heads on them (:mod:`.head_fitting`)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from torchrec_dreamshard.cache.store_keys import default_store_path, job_prefix, kernel_job
from torchrec_dreamshard.calibration.calibration_result import CalibrationResult
from torchrec_dreamshard.calibration.head_fitting import (
    fine_tune,
    kernel_accuracy,
    observation_weights,
    with_comm_model,
)
from torchrec_dreamshard.calibration.kernel_samples import (
    KERNELS_PER_CALL,
    KernelsMeasured,
    informative_groups,
    load_kernel_samples,
    measure_kernels,
    observed_jobs,
)
from torchrec_dreamshard.cost.fitting import CostSample
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.guard import MeasureFailure, guarded, warn_failures
from torchrec_dreamshard.measure.spent import spent_on
from torchrec_dreamshard.verification.noise import DRIFT_LIMIT, lasting_drift, reference_ms

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy import CandidateSource, DreamShard

WINDOW_KERNELS = 4 * KERNELS_PER_CALL  # kernels measured between two reference timings
FIT_RESERVE_S = 3.0  # seconds of the budget kept for fine-tuning


@dataclass(kw_only=True)
class CalibrationConfig:
    """How :func:`calibrate` measures and fine-tunes.

    Args:
        budget_s: seconds for measuring and fine-tuning; one batch of kernels always runs.
        store: the SQLite store of kernels (default :func:`default_store_path`).
        max_groups: fused groups measured at most, besides the single tables.
        epochs: full-batch Adam steps of the fine-tuning.
        prior: weight of the pull towards the prior's head weights.
        measure_missing: measure what the store lacks (``False``: fit on the store only).
        drift_limit: discard the kernels measured while the reference kernel moved more
            than this (``after / before - 1``; ``inf``: not timed).
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


def _all_to_all_model(config: MeasureConfig) -> Any:
    """The machine's all-to-all model for the comm head (``None``: a rank of a distributed
    job with no group and no cached fit, which keeps the prior's head)."""
    from torchrec_dreamshard.cost.collective_models import (
        default_collectives_path,
        load_all_to_all_model,
    )
    from torchrec_dreamshard.ranks.job_group import active_group
    from torchrec_dreamshard.ranks.spawn import skip_measuring

    path = config.comm_model_path
    keep = "calibration keeps the checkpoint's all-to-all head"
    if path is None and active_group() is None:
        if skip_measuring(default_collectives_path("gloo"), keep):
            return None
    return load_all_to_all_model(path)


def stored_observations(config: CalibrationConfig, task: Task) -> int:
    """How many kernels observed in running jobs over ``task``'s tables the store holds."""
    from torchrec_dreamshard.store.cost_store import CostStore

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
    """Measure ``task``'s tables (alone, then informative fused groups) within
    ``config.budget_s``, reusing the kernels the store holds, and fine-tune a copy of
    ``agent``'s cost network on them; a failed measurement is skipped, in ``failures``.

    Args:
        sources: the candidate sources whose device groups are measured (``None``: the
            agent's own).

    Raises:
        ValueError: the store cannot be opened, or another process collects into it.
    """
    config = config or CalibrationConfig()
    start = time.perf_counter()
    failures: list[MeasureFailure] = []
    result = guarded(
        "calibration",
        lambda: _calibrate(agent, task, config, sources, failures),
        device=config.measure.device,
        warn=False,
    )
    if isinstance(result, MeasureFailure):
        failures.append(result)
        warn_failures(failures, "the checkpoint is used as it is")
        seconds = time.perf_counter() - start
        return CalibrationResult.failed(agent, failures, str(config.store_path()), seconds)
    warn_failures(result.failures, _going_on(result))
    return result


def _going_on(result: CalibrationResult) -> str:
    """What calibration did without the measurements that failed, for the warning."""
    if not result.samples:
        return "the checkpoint is used as it is"
    return f"calibrated on the {result.samples} kernels measured or stored without them"


def _calibrate(
    agent: DreamShard,
    task: Task,
    config: CalibrationConfig,
    sources: Sequence[CandidateSource] | None,
    failures: list[MeasureFailure],
) -> CalibrationResult:
    """:func:`calibrate`'s work; failed measurements are appended to ``failures``."""
    from torchrec_dreamshard.store.cost_store import CostStore

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
        run, drift, discarded = _measure_in_windows(store, todo, B, config, deadline, failures)
        observed = observed_jobs(store, prefix, task.tables, mcfg, B)
        samples = load_kernel_samples(store, set(kernels) | observed, mcfg, B)
    fitted = _fitted_agent(agent, task, config, samples, failures)
    after = kernel_accuracy(fitted.cost_net, samples)
    if fitted is not agent:  # its kernel error: what the type choice's margin takes for it
        fitted.meta["calibrated"]["kernel_mape"] = after.get("cost/mape")
    return CalibrationResult(
        agent=fitted,
        measured=len(run.jobs),
        reused=len(kernels) - len(todo) + len(observed),
        skipped=len(todo) - len(run.jobs) - discarded,
        seconds=time.perf_counter() - start,
        measure_s=run.seconds,
        samples=len(samples),
        before=kernel_accuracy(agent.cost_net, samples),
        after=after,
        store=str(path),
        drift=drift,
        discarded=discarded,
        failures=failures,
    )


def _measure_in_windows(
    store: Any,
    todo: Sequence[tuple[str, list[TableSpec]]],
    batch_size: int,
    config: CalibrationConfig,
    deadline: float,
    failures: list[MeasureFailure],
) -> tuple[KernelsMeasured, float | None, int]:
    """Measure ``todo`` in windows of :data:`WINDOW_KERNELS`, discarding a window across which
    the reference drifted for good; the kept jobs, the largest drift and the discarded."""
    kept = KernelsMeasured()
    mcfg, check = config.measure, bool(todo) and math.isfinite(config.drift_limit)
    before = None
    if check:
        measure = partial(reference_ms, mcfg)
        before = _guarded_or_none("the reference kernel (before)", measure, mcfg.device, failures)
    worst, discarded = None, 0
    for lo in range(0, len(todo), WINDOW_KERNELS):
        if lo and time.perf_counter() >= deadline:
            break
        window = todo[lo : lo + WINDOW_KERNELS]
        run = measure_kernels(store, window, batch_size, mcfg, deadline, config.progress)
        failures += run.failures
        kept.seconds += run.seconds
        kept.attempted += run.attempted
        drift = _drift_or_none(before, mcfg, config.drift_limit, failures)
        if drift is not None and (worst is None or abs(drift) > abs(worst)):
            worst = drift
        # the next window starts from the speed this one ended at (unknown: from the last known)
        before = before * (1.0 + drift) if before is not None and drift is not None else before
        if drift is not None and abs(drift) > config.drift_limit:
            # measured while the machine changed speed: not this machine's kernels
            discarded += store.forget_jobs(run.jobs)  # not loaded below
        else:
            kept.jobs += run.jobs
        if run.attempted < len(window):  # the budget, or a wave that failed whole
            break
    return kept, worst, discarded


def _fitted_agent(
    agent: DreamShard,
    task: Task,
    config: CalibrationConfig,
    samples: Sequence[CostSample],
    failures: list[MeasureFailure],
) -> DreamShard:
    """``agent`` fine-tuned on ``samples`` with the machine's all-to-all head (else ``agent``)."""
    from torchrec_dreamshard.policy import DreamShard

    if failures and not samples:
        return agent
    weights = observation_weights([s.group for s in samples])
    net = fine_tune(
        agent.cost_net, samples, config.epochs, config.lr, config.prior, config.seed, weights
    )
    comm = None
    if task.num_devices > 1:  # where it fails, the checkpoint's all-to-all head is kept
        measure = partial(_all_to_all_model, config.measure)
        comm = _guarded_or_none("the all-to-all model", measure, config.measure.device, failures)
    if comm is not None:
        net = with_comm_model(net, comm, task.batch_size)
    meta = dict(agent.meta)
    meta["calibrated"] = {"kernels": len(samples), "budget_s": float(config.budget_s)}
    return DreamShard(net, agent.policy, meta, penalty=agent.penalty, sources=agent.sources)


def _guarded_or_none(
    what: str, measure: Callable[[], Any], device: str, failures: list[MeasureFailure]
) -> Any:
    """``measure()``, or ``None`` where it failed (the failure appended to ``failures``)."""
    out = guarded(f"calibration: {what}", measure, device=device, warn=False)
    if isinstance(out, MeasureFailure):
        failures.append(out)
        return None
    return out


def _drift_or_none(
    before: float | None, config: MeasureConfig, limit: float, failures: list[MeasureFailure]
) -> float | None:
    """:func:`~.noise.lasting_drift` since ``before`` (``None``: not timed)."""
    if before is None:
        return None
    measure = partial(lasting_drift, before, config, limit)
    return _guarded_or_none("the reference kernel (after)", measure, config.device, failures)
