"""Calibration kernels: which fused groups to measure, measuring them within the budget and
loading them back as cost samples."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from torchrec_dreamshard.cost.fitting import CostSample, sample_from_measurement
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.group_tasks import run_on_group
from torchrec_dreamshard.measure.guard import MeasureFailure, guarded
from torchrec_dreamshard.measure.progress import progress_bar
from torchrec_dreamshard.ranks.job_group import JobGroup, active_group, group_task
from torchrec_dreamshard.threads import single_thread

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy import CandidateSource, DreamShard

KERNELS_PER_CALL = 8  # kernels timed together in one interleaved measurement


def informative_groups(
    agent: DreamShard,
    task: Task,
    max_groups: int,
    sources: Sequence[CandidateSource] | None = None,
) -> list[list[int]]:
    """Up to ``max_groups`` fused groups from the device table sets of the candidate plans,
    most uncertain first (the ensemble's spread of predicted ``log(fwd + bwd)``)."""
    from torchrec_dreamshard.policy.safety_net import heuristic_candidates

    if max_groups == 0 or len(task.tables) < 2:
        return []
    with torch.no_grad(), single_thread():
        heuristic, _ = heuristic_candidates(task, agent.single_compute_ms(task))
        plans = [*heuristic.values(), *_policy_plans(agent, task, sources)]
        groups: dict[tuple[int, ...], None] = {}  # in order of first appearance
        for placement in plans:
            for d in range(task.num_devices):
                idx = tuple(int(i) for i in np.flatnonzero(np.asarray(placement) == d))
                if len(idx) >= 2:
                    groups.setdefault(idx, None)
        if not groups:
            return []
        keys = list(groups)
        enc = agent.cost_net.encode(torch.from_numpy(agent.inputs(task)))
        S = torch.stack([enc[list(g)].sum(0) for g in keys])
        member = torch.log(agent.cost_net.member_compute(S).sum(-1))  # [G, K]
        spread = member.std(-1) if member.shape[-1] > 1 else torch.zeros(len(keys))
    order = np.argsort(-spread.numpy(), kind="stable")[:max_groups]
    return [list(keys[i]) for i in order]


def _policy_plans(
    agent: DreamShard, task: Task, sources: Sequence[CandidateSource] | None
) -> list[np.ndarray]:
    """The policy's greedy roll-out and the safe mode's candidates (none where it fails)."""
    from torchrec_dreamshard.policy.mdp import PlacementError

    try:
        plans = [np.asarray(agent.place(task, mode="greedy"))]
        agent.place(task, mode="safe", sources=sources)
    except PlacementError:
        return []
    report = agent.last_report
    return plans + ([c.placement for c in report.candidates] if report is not None else [])


OBSERVED = "obs-"  # job keys of kernels observed in a running job start with prefix + this


def observed_jobs(
    store: Any, prefix: str, tables: Sequence[TableSpec], config: MeasureConfig, batch_size: int
) -> set[str]:
    """The store's kernels observed in running jobs over tables all among ``tables``."""
    from torchrec_dreamshard.cache.store_keys import table_signature
    from torchrec_dreamshard.measure.hardware import fingerprint_key

    wanted = prefix + OBSERVED
    jobs = {j for j in store.done_jobs(prefix) if j.startswith(wanted)}
    if not jobs:
        return set()
    mine = {table_signature(t) for t in tables}
    fp = fingerprint_key(store.fingerprint(config, "local"))
    out = set()
    for ex in store.placement_examples(fp, config.workload_key(batch_size)):
        job = ex.meta.get("job")
        if job in jobs and all(table_signature(t) in mine for t in ex.task.tables):
            out.add(job)
    return out


def store_kernel(store, tables, batch_size, fb, reference_ms, spread, config, job) -> None:
    """One measured fused kernel over ``tables`` as a one-device store row under ``job``."""
    from torchrec_dreamshard.measure.measurements import DeviceCost, PlacementMeasurement

    room = max(1, sum(t.size_bytes for t in tables))
    one = Task(tables=list(tables), num_devices=1, memory_bytes=[room], batch_size=batch_size)
    fwd, bwd = float(fb[0]), float(fb[1])
    m = PlacementMeasurement(
        per_device=[DeviceCost(fwd, bwd, 0.0, spread, len(tables))],
        step_ms=fwd + bwd,
        spread=spread,
        reference_ms=reference_ms,
        backend="local",
        comm_source="none (one device)",
    )
    store.append(one, [0] * len(tables), m, config, job=job)


@dataclass
class KernelsMeasured:
    """What :func:`measure_kernels` did.

    Attributes:
        jobs: the job keys of the kernels measured and stored, in order.
        failures: the measurements that failed; their kernels were skipped.
        attempted: kernels tried, failed or not.
    """

    jobs: list[str] = field(default_factory=list)
    seconds: float = 0.0
    failures: list[MeasureFailure] = field(default_factory=list)
    attempted: int = 0


def measure_kernels(
    store: Any,
    kernels: Sequence[tuple[str, list[TableSpec]]],
    batch_size: int,
    config: MeasureConfig,
    deadline: float,
    progress: bool = False,
) -> KernelsMeasured:
    """Time ``kernels`` (job key, tables) in batches of :data:`KERNELS_PER_CALL` with the
    reference kernel, one store row each, until ``deadline`` (the first batch always runs).

    On a job's group each rank times one batch of a wave. A failed wave is timed again a
    kernel at a time; a kernel that fails alone is skipped; a wave that fails whole stops.
    """
    group = active_group()
    wave = KERNELS_PER_CALL * (group.world if group is not None else 1)
    start = time.perf_counter()
    out = KernelsMeasured()
    bar = progress_bar(len(kernels), "calibrate: measuring kernels", progress and bool(kernels))
    try:
        for lo in range(0, len(kernels), wave):
            chunk = kernels[lo : lo + wave]
            now = time.perf_counter()
            if lo and now + (now - start) / lo * len(chunk) > deadline:  # at the rate so far
                break
            timed = _timed_wave(chunk, batch_size, config, group, out.failures)
            for job, tables, (fb, spread, ref) in timed:
                store_kernel(store, tables, batch_size, fb, ref, spread, config, job)
                out.jobs.append(job)
            out.attempted += len(chunk)
            if bar is not None:
                bar.update(len(chunk))
            if not timed:
                break
    finally:
        if bar is not None:
            bar.close()
    out.seconds = time.perf_counter() - start
    return out


def kernel_words(tables: Sequence[TableSpec]) -> str:
    """``"the kernel of t0+t3"`` (the first three names, then how many more)."""
    names = [t.name for t in tables]
    more = f"+{len(names) - 3} more" if len(names) > 3 else ""
    return "the kernel of " + "+".join(names[:3]) + more


def _timed_wave(
    chunk: Sequence[tuple[str, list[TableSpec]]],
    batch_size: int,
    config: MeasureConfig,
    group: JobGroup | None,
    failures: list[MeasureFailure],
) -> list[tuple[str, list[TableSpec], tuple[Any, float, float]]]:
    """``(job, tables, timing)`` of each kernel of ``chunk`` that could be timed."""
    tables = [t for _, t in chunk]

    def wave() -> list[tuple[Any, float, float]]:
        if group is None:
            return _time_kernels(tables, batch_size, config)
        shares = run_on_group(_group_kernel_times, tables, batch_size, config)
        return [k for share in shares for k in share]

    what = f"calibration: {len(chunk)} kernels"
    whole = guarded(what, wave, device=config.device, warn=False)
    if not isinstance(whole, MeasureFailure):
        return [(j, t, r) for (j, t), r in zip(chunk, whole, strict=True)]
    failures.append(whole)
    if len(chunk) == 1:
        return []
    out = []
    for job, t in chunk:
        one = guarded(
            f"calibration: {kernel_words(t)}",
            lambda t=t: _time_kernels([t], batch_size, config),
            device=config.device,
            warn=False,
        )
        if isinstance(one, MeasureFailure):
            failures.append(one)
        else:
            out.append((job, t, one[0]))
    return out


def _time_kernels(
    kernels: Sequence[list[TableSpec]], batch_size: int, config: MeasureConfig
) -> list[tuple[Any, float, float]]:
    """``(fwd/bwd minima, spread, reference ms)`` of each kernel, timed here."""
    from torchrec_dreamshard.measure.local import time_groups
    from torchrec_dreamshard.measure.summary import relative_spread

    out = []
    for lo in range(0, len(kernels), KERNELS_PER_CALL):
        rounds = time_groups(list(kernels[lo : lo + KERNELS_PER_CALL]), batch_size, config)
        ref = float(rounds[:, -1].sum(axis=1).min())
        for k in range(rounds.shape[1] - 1):
            fb = rounds[:, k].min(axis=0)
            out.append((fb, relative_spread(rounds[:, k].sum(axis=1)), ref))
    return out


@group_task
def _group_kernel_times(
    group: JobGroup, kernels: list[list[TableSpec]], batch_size: int, config: MeasureConfig
) -> list[tuple[Any, float, float]]:
    """This rank's share of a wave: rank ``r`` times the ``r``-th batch."""
    mine = kernels[group.rank * KERNELS_PER_CALL : (group.rank + 1) * KERNELS_PER_CALL]
    return _time_kernels(mine, batch_size, config) if mine else []


def load_kernel_samples(
    store: Any, jobs: set[str], config: MeasureConfig, batch_size: int
) -> list[CostSample]:
    """The stored kernels among ``jobs`` as one-device cost samples, as measured (not
    normalised by the reference kernel)."""
    from torchrec_dreamshard.measure.hardware import fingerprint_key

    fp = fingerprint_key(store.fingerprint(config, "local"))
    if store.count(fp, config.workload_key(batch_size), ok=True) == 0:
        return []
    examples = store.placement_examples(fp, config.workload_key(batch_size))
    rows = [ex for ex in examples if ex.meta.get("job") in jobs]
    out = []
    for ex in rows:
        d, t, B = ex.per_device[0], ex.task, ex.task.batch_size
        per_device = [(d.fwd_ms, d.bwd_ms, 0.0)]
        group = ex.meta["job"]
        out.append(sample_from_measurement(group, t.tables, ex.placement, 1, B, per_device))
    return out
