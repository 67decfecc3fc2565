"""Few-shot calibration on the user's own hardware and tables, and verification by
measuring the best candidate plans.

Calibration (:func:`calibrate`). Within a time budget, on the local device:

1. each of the task's tables is timed alone (one fused kernel per table, several tables'
   kernels and the reference kernel in interleaved rounds);
2. then fused groups chosen to be informative: the device table sets of the heuristic and
   policy plans, most uncertain first (the ensemble members' spread of the group's
   predicted ``log(fwd + bwd)``);
3. every kernel's figures are kept in a :class:`~torchrec_dreamshard.measure.CostStore`
   (default :func:`default_store_path`), one row per kernel under a job key made of the
   hardware fingerprint, the workload (batch, optimizer, precision, device) and the content
   signature of its tables (:func:`table_signature`: everything but the name), so a second
   calibration of the same tables on the same machine measures nothing;
4. the cost network's device heads (``c, W, U, u, V``: the physical and the fusion part)
   are fine-tuned on those kernels with the bundled weights as the prior:

       loss = sum_k sum_s w_ks huber(log pred_k(s) - log meas(s)) / sum w
              + prior * mean_p (theta_p - theta_p^0)^2

   each member ``k`` on its own Poisson(1) bootstrap weights ``w_ks`` (so the members'
   disagreement still says where the data is thin). The table encoder is frozen, so the
   policy network sees the same table encodings as before.

Verification (:func:`verify`): the ``k`` candidate plans the cost model rates best (the
safety net's report) and every classic heuristic's plan are measured on real kernels in
interleaved rounds; the plan of lowest median measured step wins.
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchrec_dreamshard.cost_fit import (
    CostSample,
    pack,
    predict_samples,
    sample_from_measurement,
    weighted_log_loss,
)
from torchrec_dreamshard.cost_model import EPS_MS, CostNet
from torchrec_dreamshard.measure.config import MeasureConfig, stable_key
from torchrec_dreamshard.tables import TableSpec
from torchrec_dreamshard.tasks import Task
from torchrec_dreamshard.threads import single_thread

STORE_ENV = "DREAMSHARD_CALIBRATION_STORE"  # overrides the default store path
JOB_ROOT = "calib"
HEAD_PARAMETERS = ("c_raw", "W_raw", "U_raw", "u", "V_raw")  # fine-tuned; the rest frozen
FIT_RESERVE_S = 3.0  # seconds of the budget kept for fine-tuning
KERNELS_PER_CALL = 8  # kernels timed together in one interleaved measurement


def default_store_path() -> Path:
    """``$DREAMSHARD_CALIBRATION_STORE``, else ``calibration.sqlite`` in the user's cache
    directory (``$XDG_CACHE_HOME`` or ``~/.cache``)/torchrec_dreamshard."""
    env = os.environ.get(STORE_ENV)
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "torchrec_dreamshard" / "calibration.sqlite"


def table_signature(table: TableSpec) -> str:
    """A short hash of everything that defines a table's kernel but its name."""
    data = table.to_dict()
    data.pop("name")
    return stable_key(data)


def kernel_job(prefix: str, tables: Sequence[TableSpec]) -> str:
    """The store's job key of one fused kernel over ``tables`` (order-free)."""
    sigs = sorted(table_signature(t) for t in tables)
    if len(sigs) == 1:
        return f"{prefix}t-{sigs[0]}"
    return f"{prefix}g{len(sigs)}-{stable_key(sigs, 16)}"


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
    """

    budget_s: float = 60.0
    store: str | os.PathLike | None = None
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    max_groups: int = 32
    epochs: int = 400
    lr: float = 0.05
    prior: float = 1e-3
    seed: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        if not (isinstance(self.budget_s, int | float) and math.isfinite(self.budget_s)):
            raise ValueError(f"budget_s must be a finite number of seconds, got {self.budget_s!r}")
        if self.budget_s <= 0:
            raise ValueError(f"budget_s must be > 0 seconds, got {self.budget_s}")
        for name in ("max_groups", "epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
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
    """

    agent: Any
    measured: int
    reused: int
    skipped: int
    seconds: float
    measure_s: float
    samples: int
    before: dict[str, float]
    after: dict[str, float]
    store: str

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
        ]


# ----------------------------------------------------------------------------------------
# What to measure
# ----------------------------------------------------------------------------------------


def informative_groups(agent: Any, task: Task, max_groups: int) -> list[list[int]]:
    """Up to ``max_groups`` fused groups (table indices, two or more tables) from the
    device table sets of the heuristic plans and the policy's greedy plan, most uncertain
    first: by the spread over the ensemble's members of the predicted log(fwd + bwd)."""
    from torchrec_dreamshard.policy.safety_net import heuristic_candidates

    if max_groups == 0 or len(task.tables) < 2:
        return []
    with torch.no_grad(), single_thread():
        plans, _ = heuristic_candidates(task, agent.single_compute_ms(task))
        named = dict(plans)
        named["policy_greedy"] = np.asarray(agent.place(task, mode="greedy"))
        groups: dict[tuple[int, ...], None] = {}
        for placement in named.values():
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


# ----------------------------------------------------------------------------------------
# Measuring, with the store
# ----------------------------------------------------------------------------------------


def job_prefix(store: Any, config: MeasureConfig, batch_size: int) -> str:
    """``calib/<fingerprint>/<workload>/``: this machine's and workload's kernels."""
    from torchrec_dreamshard.measure.hardware import fingerprint_key

    fp = fingerprint_key(store.fingerprint(config, "local"))
    return f"{JOB_ROOT}/{fp}/{config.workload_key(batch_size)}/"


def _store_kernel(store, tables, batch_size, fb, reference_ms, spread, config, job) -> None:
    from torchrec_dreamshard.measure.types import DeviceCost, PlacementMeasurement

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


def measure_kernels(
    store: Any,
    kernels: Sequence[tuple[str, list[TableSpec]]],
    batch_size: int,
    config: MeasureConfig,
    deadline: float,
    progress: bool = False,
) -> tuple[int, float]:
    """Time ``kernels`` (job key, tables) in batches of :data:`KERNELS_PER_CALL`, each
    batch in interleaved rounds with the reference kernel, appending one store row per
    kernel, until the ``deadline`` (``time.perf_counter()``) would be passed (the first
    batch always runs). Returns the kernels measured and the seconds it took."""
    from torchrec_dreamshard.measure.local import time_groups
    from torchrec_dreamshard.measure.summary import relative_spread

    start = time.perf_counter()
    done = 0
    bar = None
    if progress and kernels:
        from tqdm import tqdm

        bar = tqdm(total=len(kernels), desc="calibrate: measuring kernels", leave=False)
    try:
        for lo in range(0, len(kernels), KERNELS_PER_CALL):
            chunk = kernels[lo : lo + KERNELS_PER_CALL]
            if done and time.perf_counter() + _chunk_estimate(start, done, chunk) > deadline:
                break
            rounds = time_groups([t for _, t in chunk], batch_size, config)
            ref = float(rounds[:, -1].sum(axis=1).min())
            for k, (job, tables) in enumerate(chunk):
                fb = rounds[:, k].min(axis=0)
                spread = relative_spread(rounds[:, k].sum(axis=1))
                _store_kernel(store, tables, batch_size, fb, ref, spread, config, job)
            done += len(chunk)
            if bar is not None:
                bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
    return done, time.perf_counter() - start


def _chunk_estimate(start: float, done: int, chunk: Sequence) -> float:
    """Seconds the next batch should take, from the rate so far (per kernel)."""
    return (time.perf_counter() - start) / done * len(chunk)


def load_kernel_samples(
    store: Any, jobs: set[str], config: MeasureConfig, batch_size: int
) -> list[CostSample]:
    """The stored kernels among ``jobs`` (this machine, ``config``'s workload at
    ``batch_size``) as one-device cost samples, normalised to the median reference-kernel
    time of the rows read (the machine's typical speed)."""
    from torchrec_dreamshard.measure.hardware import fingerprint_key
    from torchrec_dreamshard.measure.summary import reference_scales

    fp = fingerprint_key(store.fingerprint(config, "local"))
    if store.count(fp, config.workload_key(batch_size), ok=True) == 0:
        return []
    examples = store.placement_examples(fp, config.workload_key(batch_size))
    rows = [ex for ex in examples if ex.meta.get("job") in jobs]
    scales = reference_scales([ex.reference_ms for ex in rows])
    out = []
    for ex, s in zip(rows, scales, strict=True):
        d, t, B = ex.per_device[0], ex.task, ex.task.batch_size
        per_device = [(d.fwd_ms * s, d.bwd_ms * s, 0.0)]
        group = ex.meta["job"]
        out.append(sample_from_measurement(group, t.tables, ex.placement, 1, B, per_device))
    return out


# ----------------------------------------------------------------------------------------
# Fine-tuning
# ----------------------------------------------------------------------------------------


def fine_tune(
    net: CostNet,
    samples: Sequence[CostSample],
    epochs: int = 400,
    lr: float = 0.05,
    prior: float = 1e-3,
    seed: int = 0,
) -> CostNet:
    """A copy of ``net`` whose device heads are fitted to ``samples`` with an L2 pull
    towards ``net``'s own head weights (see the module docstring); the encoder is frozen.
    """
    tuned = copy.deepcopy(net)
    if not samples or epochs == 0:
        return tuned.eval()
    heads = [p for n, p in tuned.named_parameters() if n in HEAD_PARAMETERS]
    anchors = [p.detach().clone() for p in heads]
    for n, p in tuned.named_parameters():
        p.requires_grad_(n in HEAD_PARAMETERS)
    rng = np.random.default_rng(seed)
    boot = torch.from_numpy(rng.poisson(1.0, (len(samples), net.members)).astype(np.float32))
    boot[:, 0] = 1.0  # one member sees every sample once
    batch = pack(samples)
    dev = np.concatenate([s.dev_ms for s in samples])
    log_dev = torch.from_numpy(np.log(np.maximum(dev, EPS_MS))).float()
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


def kernel_accuracy(net: CostNet, samples: Sequence[CostSample]) -> dict[str, float]:
    """MAPE (%) of the predicted fwd + bwd of the kernels and the members' mean spread."""
    if not samples:
        return {}
    with torch.no_grad(), single_thread():
        _, step, spread = predict_samples(net, samples)
    true = np.array([s.step_ms for s in samples])
    mape = float(np.mean(np.abs(step - true) / np.maximum(true, EPS_MS)) * 100)
    return {"cost/mape": mape, "cost/log_std": float(np.mean(spread))}


# ----------------------------------------------------------------------------------------
# Calibrate
# ----------------------------------------------------------------------------------------


def calibrate(agent: Any, task: Task, config: CalibrationConfig | None = None) -> CalibrationResult:
    """Measure ``task``'s tables (alone, then informative fused groups) on this machine
    within ``config.budget_s`` and fine-tune ``agent``'s cost network on them.

    Kernels already in the store (same machine, workload and table contents) are reused,
    not measured again.

    Args:
        agent: a :class:`~torchrec_dreamshard.policy.DreamShard` (the prior; unchanged).
        task: the task whose tables are measured (at its batch size).
        config: budget, store, measurement and fine-tuning settings.

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
        for g in informative_groups(agent, task, config.max_groups):
            tables = [task.tables[i] for i in g]
            kernels.setdefault(kernel_job(prefix, tables), tables)
        done = store.done_jobs(prefix)
        todo = [(j, t) for j, t in kernels.items() if j not in done]
        measured, measure_s = measure_kernels(store, todo, B, mcfg, deadline, config.progress)
        samples = load_kernel_samples(store, set(kernels), mcfg, B)
    net = fine_tune(agent.cost_net, samples, config.epochs, config.lr, config.prior, config.seed)
    meta = dict(agent.meta)
    meta["calibrated"] = {"kernels": len(samples), "budget_s": float(config.budget_s)}
    tuned = DreamShard(net, agent.policy, meta, penalty=agent.penalty)
    return CalibrationResult(
        agent=tuned,
        measured=measured,
        reused=len(kernels) - len(todo),
        skipped=len(todo) - measured,
        seconds=time.perf_counter() - start,
        measure_s=measure_s,
        samples=len(samples),
        before=kernel_accuracy(agent.cost_net, samples),
        after=kernel_accuracy(net, samples),
        store=str(path),
    )


# ----------------------------------------------------------------------------------------
# Verify
# ----------------------------------------------------------------------------------------


@dataclass
class VerifiedPlan:
    """One plan measured by :func:`verify`."""

    name: str
    placement: list[int]
    predicted_ms: float
    log_std: float
    measured_ms: float = float("nan")  # median over rounds of the measured step
    rounds_ms: list[float] = field(default_factory=list)


@dataclass
class VerifyResult:
    """The plans :func:`verify` measured, fastest first, and the time it took."""

    plans: list[VerifiedPlan]
    seconds: float

    @property
    def winner(self) -> VerifiedPlan:
        return self.plans[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "winner": self.winner.name,
            "seconds": self.seconds,
            "plans": [
                {
                    "name": p.name,
                    "predicted_ms": p.predicted_ms,
                    "measured_ms": p.measured_ms,
                    "rounds_ms": p.rounds_ms,
                }
                for p in self.plans
            ],
        }

    def lines(self) -> list[str]:
        rounds = len(self.winner.rounds_ms)
        out = [
            f"verification: {len(self.plans)} plans measured in {rounds} interleaved rounds "
            f"({self.seconds:.1f}s); fastest: {self.winner.name}",
            f"  {'plan':30s} {'predicted ms':>12s} {'measured ms':>12s} {'error':>7s}",
        ]
        for p in self.plans:
            err = (p.predicted_ms / p.measured_ms - 1.0) * 100.0
            out.append(f"  {p.name:30s} {p.predicted_ms:12.3f} {p.measured_ms:12.3f} {err:+6.1f}%")
        return out


def verify_candidates(
    agent: Any,
    task: Task,
    k: int,
    seed: int = 0,
    extra: Mapping[str, Sequence[int]] | None = None,
) -> list[VerifiedPlan]:
    """The ``extra`` plans, the ``k`` best-rated distinct plans of the agent's last
    safety-net report (run ``agent.place`` first) and every heuristic's plan, named, with
    their predictions."""
    from torchrec_dreamshard import baselines

    report = getattr(agent, "last_report", None)
    named: dict[tuple[int, ...], str] = {}
    for name, p in (extra or {}).items():
        named.setdefault(tuple(int(d) for d in p), name)
    if report is not None:
        for c in report.candidates:
            if len([n for n in named.values() if not n.startswith("heuristic:")]) >= k:
                break
            named.setdefault(tuple(int(d) for d in c.placement), c.name)
    for h in baselines.HEURISTICS:
        try:
            p = tuple(baselines.place(h, task, seed=seed))
        except baselines.NoPlanError:
            continue
        if p in named:
            named[p] = f"{named[p]}={h}"
        else:
            named[p] = f"heuristic:{h}"
    out = []
    for p, name in named.items():
        pred = agent.predict(task, list(p))
        out.append(VerifiedPlan(name, list(p), pred.step_ms, pred.step_log_std))
    return out


def verify(
    agent: Any,
    task: Task,
    k: int = 4,
    config: MeasureConfig | None = None,
    rounds: int = 3,
    seed: int = 0,
    progress: bool = False,
    extra: Mapping[str, Sequence[int]] | None = None,
) -> VerifyResult:
    """Measure the ``k`` best-rated candidates and the heuristics' plans (see
    :func:`verify_candidates`; ``extra`` adds named plans) in ``rounds`` interleaved
    rounds (each round visits every plan once, in a shuffled order); the plans sorted by
    median measured step cost.

    Raises:
        RuntimeError: a measurement failed (its error is named).
    """
    from torchrec_dreamshard.measure import measure_placement

    if k < 1 or rounds < 1:
        raise ValueError(f"verify needs k >= 1 and rounds >= 1, got {k}, {rounds}")
    start = time.perf_counter()
    config = replace(config or MeasureConfig(), rounds=1)
    plans = verify_candidates(agent, task, k, seed, extra)
    rng = np.random.default_rng(seed)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=rounds * len(plans), desc="verify: measuring plans", leave=False)
    try:
        for _ in range(rounds):
            for i in rng.permutation(len(plans)):
                m = measure_placement(task, plans[i].placement, config)
                if not m.ok:
                    raise RuntimeError(f"verification of plan {plans[i].name} failed: {m.error}")
                plans[i].rounds_ms.append(float(m.step_ms))
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    for p in plans:
        p.measured_ms = float(np.median(p.rounds_ms))
    plans.sort(key=lambda p: p.measured_ms)
    return VerifyResult(plans, time.perf_counter() - start)


# ----------------------------------------------------------------------------------------
# Planning with both
# ----------------------------------------------------------------------------------------


@dataclass
class PlanOutcome:
    """A plan made by :func:`plan_task`.

    Attributes:
        placement: device per table.
        agent: the agent that planned (the calibrated one, or the prior).
        calibration: what calibration did (``None`` without it).
        verification: the measured candidates (``None`` without verification).
    """

    placement: list[int]
    agent: Any
    calibration: CalibrationResult | None = None
    verification: VerifyResult | None = None

    def lines(self) -> list[str]:
        out = self.calibration.lines() if self.calibration else []
        return out + (self.verification.lines() if self.verification else [])


def plan_task(
    agent: Any,
    task: Task,
    *,
    mode: str = "safe",
    num_samples: int = 4,
    seed: int = 0,
    calibration: CalibrationConfig | None = None,
    verify_k: int = 0,
    verify_rounds: int = 3,
    verify_config: MeasureConfig | None = None,
    progress: bool = False,
) -> PlanOutcome:
    """Calibrate (when ``calibration`` is given), place, and verify (when ``verify_k``).

    Args:
        agent: the prior agent (unchanged).
        task: the task.
        mode, num_samples, seed: as ``DreamShard.place``.
        calibration: calibration settings; ``None`` plans with ``agent`` as it is.
        verify_k: measure the ``verify_k`` best-rated candidates and the heuristics' plans
            and keep the fastest (0: no verification).
        verify_rounds: interleaved rounds of the verification.
        verify_config: its measurement settings (default: the calibration's, else
            :class:`MeasureConfig`'s).
        progress: tqdm bars.
    """
    if verify_k < 0:
        raise ValueError(f"verify must be >= 0 candidate plans, got {verify_k}")
    cal = calibrate(agent, task, calibration) if calibration is not None else None
    planner = cal.agent if cal is not None else agent
    placement = planner.place(task, mode=mode, num_samples=num_samples, seed=seed)
    ver = None
    if verify_k:
        mcfg = verify_config or (calibration.measure if calibration is not None else None)
        ver = verify(
            planner, task, verify_k, mcfg, verify_rounds, seed, progress, {"chosen": placement}
        )
        placement = list(ver.winner.placement)
    return PlanOutcome(placement, planner, cal, ver)


class CalibratingAgent:
    """An agent (``PlacementAgent``) whose ``place`` calibrates on the task's tables
    first and verifies the best candidates after (:func:`plan_task`); ``predict`` and
    everything else use the calibrated agent once there is one.

    Args:
        agent: the prior agent.
        calibration: calibration settings (``None``: verification only).
        verify_k: candidates to verify by measuring (0: none).
        verify_rounds: interleaved rounds of the verification.
        progress: tqdm bars.
    """

    def __init__(
        self,
        agent: Any,
        calibration: CalibrationConfig | None,
        verify_k: int = 0,
        verify_rounds: int = 3,
        progress: bool = True,
    ) -> None:
        self.prior = agent
        self.current = agent
        self.calibration = calibration
        self.verify_k, self.verify_rounds, self.progress = verify_k, verify_rounds, progress
        self.last_outcome: PlanOutcome | None = None
        self.calibration_enabled = True

    def place(self, task: Task, mode: str = "safe", num_samples: int = 4, seed: int = 0):
        import logging

        out = plan_task(
            self.prior,
            task,
            mode=mode,
            num_samples=num_samples,
            seed=seed,
            calibration=self.calibration,
            verify_k=self.verify_k,
            verify_rounds=self.verify_rounds,
            progress=self.progress,
        )
        self.current, self.last_outcome = out.agent, out
        log = logging.getLogger("torchrec_dreamshard.calibration")
        for line in out.lines():
            log.info(line)
        return out.placement

    def predict(self, task: Task, placement: Sequence[int]):
        return self.current.predict(task, placement)

    def table_costs(self, task: Task):
        return self.current.table_costs(task)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("current", "prior"):
            raise AttributeError(name)
        return getattr(self.current, name)
