"""``JobObserver``: the running DMP job as the planner's measurement.

    plan = planner.collective_plan(model, sharders, pg)
    dmp = DistributedModelParallel(module=model, device=device, plan=plan, sharders=sharders)
    observer = planner.observe(dmp)      # every rank, after the DMP is built
    for batch in loader:
        ...train step...
        observer.step()                  # cheap; samples one step in ``every``
    report = observer.report()           # collective; a plain JSON-able dict
    new_plan = observer.replan()         # collective; the same plan when no change pays
    observer.apply_in_place(new_plan)    # collective; table-wise moves, no restart

A sampled step is the time from one ``step()`` call to the next, run under
``torch.profiler`` (:mod:`.profiling`); the other steps cost a clock read and a counter
increment. The profiler's events are read when the samples are gathered, not in the
training loop.

What observing costs is measured as it runs: a sampled step's wall time (the profiler's
start and stop included) against the median of the plain steps around it. The observer
samples at most one step in ``every``, and less often where that cost would exceed
``max_overhead`` of the job's time (a job of 3 ms steps, whose profiled step costs 30 ms
more, is sampled about one step in a thousand at 1%); :attr:`JobObserver.overhead` is the
fraction it has cost so far, and the report carries it.
``report()`` gathers all ranks' samples (:mod:`.observed_job_report`); ``replan()`` learns from them
and plans again on rank 0 (:mod:`.replan`) while the other ranks serve its measurements,
as ``collective_plan`` does, then every rank gets the plan. The report logs like TorchRec's
planner stats (``logging.INFO`` on ``torchrec_dreamshard.feedback``).
"""

from __future__ import annotations

import atexit
import logging
import statistics
import time
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from torchrec_dreamshard.feedback.inputs import (
    InputRecorder,
    ObservedInputs,
    embedding_tables,
    pooling_sums,
)
from torchrec_dreamshard.feedback.observed_job_report import build_report, rank_tables, report_lines
from torchrec_dreamshard.feedback.profiling import MARK, StepProfile, step_profile
from torchrec_dreamshard.feedback.sampling import quiet_stderr, sampling_interval
from torchrec_dreamshard.measure.distributed_job_group import JobGroup, broadcast, driving, serve

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec.distributed.types import ShardingPlan

    from torchrec_dreamshard.planner import DreamShardPlanner

logger = logging.getLogger("torchrec_dreamshard.feedback")

EVERY = 20  # sample at most one step in this many
WARMUP = 5  # steps before the first sample (allocations, caches, autotuning)
MAX_SAMPLES = 64  # sampled steps kept (the newest); their events are read at report()
MAX_OVERHEAD = 0.01  # the share of the job's time sampling may cost (the target is 2%)
PLAIN_STEPS = 64  # plain (unsampled) step times kept, for the baseline of a sampled one
EXTRAS = 5  # the last samples' costs whose median sets the interval (one outlier does not)
LONG_STEP = 10.0  # a sampled "step" this many plain steps long spans a pause: dropped
BURST = 4  # the first samples of a job (or of a followed restart) come closer together,
BURST_EVERY = 5  # one step in this many: a re-plan soon after the start has a few to learn from


_OPEN: weakref.WeakSet[JobObserver] = weakref.WeakSet()  # observers with a sample running


@atexit.register
def _close_open_samples() -> None:
    """Stop every sample still running when the process exits (see ``close``)."""
    for observer in list(_OPEN):
        observer.close()


class JobObserver:
    """Observes a DMP job planned by ``planner`` (see the module docstring).

    Args:
        planner: the planner whose ``collective_plan`` made the job's plan.
        dmp: the job's ``DistributedModelParallel`` module.
        pg: the job's process group (default: the world).
        every: sample at most one step in ``every``.
        warmup: steps before the first sample.
        max_overhead: sample less often where a sample would cost more than this share
            of the job's time (``None``: one step in ``every``, whatever it costs).
    """

    def __init__(
        self,
        planner: DreamShardPlanner,
        dmp: Any,
        pg: Any = None,
        every: int = EVERY,
        warmup: int = WARMUP,
        max_overhead: float | None = MAX_OVERHEAD,
    ) -> None:
        if every < 1 or warmup < 0:
            raise ValueError(f"every must be >= 1 and warmup >= 0, got {every}, {warmup}")
        if max_overhead is not None and not 0 < max_overhead < 1:
            raise ValueError(f"max_overhead must be in (0, 1) or None, got {max_overhead!r}")
        if planner.last_plan is None or planner.last_prediction is None:
            raise ValueError("observe() needs the planner's plan: call collective_plan first")
        self._planner = planner
        self._dmp = dmp
        self._group = JobGroup.of(pg if pg is not None else dist.GroupMember.WORLD)
        self.every, self.warmup, self.max_overhead = every, warmup, max_overhead
        self.steps = 0
        self.interval = every  # steps between samples now (see sampling_interval)
        self._next = warmup  # the step count at which the next sample starts
        self._first: float | None = None  # perf_counter at the first step() call
        self._last: float | None = None  # perf_counter at the end of the last step() call
        self._entered = 0.0  # perf_counter before the open sample's profiler started
        self._plain: deque[float] = deque(maxlen=PLAIN_STEPS)  # plain steps' ms
        self._extra_ms = 0.0  # what sampling cost so far
        self._extras: deque[float] = deque(maxlen=EXTRAS)  # the last kept samples' costs
        self.dropped = 0  # samples that spanned a pause, dropped
        self._burst = BURST  # samples still to take at the burst's spacing
        self._samples: deque[Any] = deque(maxlen=MAX_SAMPLES)  # raw, read when gathered
        self._profiler: Any = None
        self._started = (0.0, 0.0)  # perf_counter and wall clock at the sampled step's start
        self.plan = planner.last_plan  # the observed plan
        self.prediction = planner.last_prediction  # as planned
        self.proposed: Any = None  # the last replan()'s plan, as the updated model predicts it
        self.model = "checkpoint"
        self.last_replan: dict[str, Any] | None = None
        self._inputs = InputRecorder(dmp)  # what the sampled steps feed the tables
        # the model's tables and their features, known where the model was planned (rank 0)
        planned = getattr(planner, "_planned", None)
        self._table_features = embedding_tables(planned[0]) if planned is not None else None
        self._start_sample()  # the profiler's first start takes ~1 s: not in a training step
        self.close()

    def step(self) -> None:
        """Call once per training step, after it: ends a sampled step, and starts the
        profiler when the next step is to be sampled."""
        now = time.perf_counter()
        if self._first is None:
            self._first = now
        if self._profiler is not None:
            self._finish_sample()
        elif self._last is not None:
            self._plain.append((now - self._last) * 1e3)
        self.steps += 1
        if self.steps >= self._next:
            self._start_sample()
        self._last = time.perf_counter()

    @property
    def sampling(self) -> bool:
        """Whether a sample is open (the step now running is sampled)."""
        return self._profiler is not None

    @property
    def sampling_ms(self) -> float:
        """What sampling has cost so far on this rank, in ms: the sampled steps' time
        beyond the median plain step."""
        return self._extra_ms

    @property
    def overhead(self) -> float:
        """The share of the job's time that sampling cost so far (sampled steps beyond
        the median plain step), on this rank."""
        if self._first is None or self._last is None:
            return 0.0
        base = (self._last - self._first) * 1e3 - self._extra_ms
        return self._extra_ms / base if base > 0 else 0.0

    def _start_sample(self) -> None:
        from torch.profiler import ProfilerActivity, profile, record_function

        activities = [ProfilerActivity.CPU]
        if self._group.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        for other in list(_OPEN):  # one profiler at a time: nested ones crash at exit
            other.close()
        self._entered = time.perf_counter()
        self._profiler = profile(activities=activities)
        _OPEN.add(self)
        with quiet_stderr():  # Kineto prints two lines to stderr per start and stop
            self._profiler.__enter__()
        with record_function(MARK):
            self._started = (time.perf_counter(), time.time())
        self._inputs.start()

    def _finish_sample(self) -> None:
        if self._group.device.type == "cuda":
            torch.cuda.synchronize(self._group.device)
        step_ms = (time.perf_counter() - self._started[0]) * 1e3
        profiler = self._profiler
        plain = statistics.median(self._plain) if self._plain else None
        # a "step" far longer than the job's steps spans a pause (an evaluation, a
        # checkpoint, a gap between runs): not one training step, so neither a sample nor
        # a measure of what sampling costs; every rank drops it if any rank would
        long = plain is not None and len(self._plain) >= 5 and step_ms > LONG_STEP * plain
        fed = self._inputs.take()
        self.close()
        # the sampled step, the profiler's start and stop included, beyond a plain step:
        # what sampling it cost (for a dropped one, what samples have cost so far)
        cost_ms = (time.perf_counter() - self._entered) * 1e3
        extra = max(0.0, cost_ms - (plain if plain is not None else cost_ms))
        wanted = self.every
        if not long:
            self._extras.append(extra)
        if self.max_overhead is not None and self._extras:
            typical = statistics.median(self._extras)
            wanted = sampling_interval(typical, plain or cost_ms, self.every, self.max_overhead)
        self.interval, dropped = self._agreed(wanted, long)
        if dropped:
            self._extra_ms += statistics.median(self._extras) if self._extras else 0.0
            self.dropped += 1
        else:
            self._samples.append((profiler, step_ms, self._started[1]))
            self._inputs.keep(fed)
            self._extra_ms += extra
            self._burst -= 1
        burst = self._burst > 0  # the same on every rank: the kept samples are agreed
        self._next = self.steps + (min(self.every, BURST_EVERY) if burst else self.interval)

    def _agreed(self, interval: int, drop: bool) -> tuple[int, bool]:
        """The longest interval any rank wants, and whether any rank drops the sample
        (collective, once per sample): every rank must sample the same steps and keep the
        same samples, or their all-to-alls could not be paired."""
        value = torch.tensor([interval, int(drop)], dtype=torch.int64, device=self._group.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self._group.pg)
        return int(value[0].item()), bool(value[1].item())

    @property
    def profiles(self) -> list[StepProfile]:
        """This rank's sampled steps (the newest :data:`MAX_SAMPLES`), read from their
        profiler events now (not in the training step that was sampled)."""
        out = []
        for i, sample in enumerate(self._samples):
            if not isinstance(sample, StepProfile):
                profiler, step_ms, wall = sample
                self._samples[i] = sample = step_profile(profiler.events(), step_ms, wall)
            out.append(sample)
        return out

    def close(self) -> None:
        """Stop a sample still open (dropped, not half-counted). Called by :meth:`report`
        and :meth:`replan`, and at exit: a profiler left running when the process ends
        crashes it in PyTorch's teardown."""
        self._inputs.stop(keep=False)
        if self._profiler is not None:
            with quiet_stderr():
                self._profiler.__exit__(None, None, None)
            self._profiler = None
        _OPEN.discard(self)

    def _gather(self, with_inputs: bool = False) -> dict[str, list[Any]]:
        """Every rank's sampled steps, what sampling cost it, the ids per sample its tables
        were fed and the model's tables (rank 0's), in one collective; where
        ``with_inputs``, each rank's recorded inputs too, to rank 0 only (a second
        collective: up to tens of MB a rank, which the other ranks have no use for)."""
        self.close()
        mine = {
            "profiles": self.profiles,
            "overhead": self.overhead,
            "sums": pooling_sums(self._inputs.steps),
            "tables": self._table_features,
        }
        out: list[Any] = [None] * self._group.world
        dist.all_gather_object(out, mine, group=self._group.pg)
        gathered = {key: [o[key] for o in out] for key in mine}
        inputs: list[Any] | None = None
        if with_inputs:
            inputs = [None] * self._group.world if self._group.rank == 0 else None
            dist.gather_object(list(self._inputs.steps), inputs, group=self._group.pg, group_dst=0)
        gathered["inputs"] = inputs or []
        return gathered

    def observed_inputs(self, gathered: dict[str, list[Any]]) -> ObservedInputs | None:
        """What the job fed its tables, from :meth:`_gather`'s result (``None`` where the
        model's tables are unknown: it was not planned through ``collective_plan``)."""
        tables = gathered["tables"][0]
        if tables is None:
            return None
        sums: dict[str, tuple[int, int]] = {}
        for rank in gathered["sums"]:
            for key, (ids, samples) in rank.items():
                total = sums.get(key, (0, 0))
                sums[key] = (total[0] + ids, total[1] + samples)
        constraints = self._planner.constraints_given
        return ObservedInputs(tables, sums, constraints, gathered["inputs"])

    def report(self) -> dict[str, Any]:
        """Every rank's predicted and measured embedding cost (collective; the same dict
        on every rank; see :mod:`.observed_job_report`)."""
        gathered = self._gather()
        profiles, overheads = gathered["profiles"], gathered["overhead"]
        report = build_report(profiles, self.prediction, self._tables(), self.model)
        report["observer"] = {
            "interval": self.interval,
            "steps": self.steps,
            "overhead": max(overheads),
            "overhead_by_rank": overheads,
            "sampled_steps": len(self._samples),
        }
        inputs = self.observed_inputs(gathered)
        if inputs is not None:
            report["inputs"] = inputs.to_dict()
        if self.last_replan is not None:
            report["replan"] = self.last_replan
        for line in report_lines(report):
            logger.info(line)
        return report

    def _tables(self) -> list[list[str]]:
        """The tables (``module.table``) each rank holds in the observed plan."""
        return rank_tables(self.plan, self._group.world)

    def replan(self) -> ShardingPlan:
        """Learn from the observed steps and plan again (collective): the updated cost
        network prices the observed plan from now on (:meth:`report`), and the returned
        plan is a new one only where it is predicted to pay beyond the model's
        uncertainty (else the observed plan). Restart the job with it, or apply it in
        place where ``DistributedModelParallel.reshard`` can."""
        from torchrec_dreamshard.feedback.observed_job_report import measured_by_rank
        from torchrec_dreamshard.feedback.replan import learn_and_replan

        gathered = self._gather(with_inputs=True)
        profiles = gathered["profiles"]
        if min(len(p) for p in profiles) == 0:
            raise ValueError(
                f"replan() needs sampled steps: {self.steps} steps observed, the first "
                f"sample after {self.warmup} and then one in {self.interval}"
            )
        if self._group.rank == 0:
            with driving(self._group):
                measured = measured_by_rank(profiles)
                inputs = self.observed_inputs(gathered)
                sent = self._replan_rank0(learn_and_replan, measured, inputs)
            broadcast(self._group, sent)
        else:
            sent = serve(self._group)
        if isinstance(sent, str):
            raise RuntimeError(f"rank 0 could not re-plan: {sent}")
        plan, self.prediction, self.proposed, self.last_replan = sent
        self.model = "updated"
        if not self.last_replan.get("changed"):
            plan = self.plan  # the observed plan itself, on every rank: `new is not plan`
        return plan

    def apply_in_place(self, plan: ShardingPlan) -> list[str]:
        """Apply ``plan`` (from :meth:`replan`) to the running job without a restart
        (collective: every rank, the same plan): its table-wise tables that only change
        rank move, with their weights and fused optimizer state
        (:func:`~torchrec_dreamshard.feedback.reshard.apply_in_place`, through
        ``DistributedModelParallel.reshard``). Raises a ``ValueError`` before moving
        anything where the plan changes more than that: restart the job with it then.
        Observing goes on, of the new plan; returns the moved tables."""
        from torchrec_dreamshard.feedback.reshard import apply_in_place

        moved = apply_in_place(self._dmp, plan)
        self._inputs.attach(self._dmp)  # modules a reshard rebuilt
        if moved:
            self.plan, self.prediction = plan, self.proposed
            self._samples.clear()
        return moved

    def follow(self, dmp: Any, plan: ShardingPlan) -> None:
        """Observe ``dmp``, a job restarted in this process with ``plan`` (what
        :meth:`replan` returned), from now on: its report prices it with the updated
        network's prediction of that plan, made before any step of it ran (collective
        only through the steps and reports that follow). Samples of the earlier job are
        dropped."""
        if self.last_replan is None:
            raise ValueError("follow() needs a replan() first: it observes the plan it returned")
        self.close()
        if str(plan) != str(self.plan):
            self.plan, self.prediction = plan, self.proposed
        self._dmp = dmp
        self._inputs.attach(dmp)
        self._samples.clear()
        self._inputs.steps.clear()
        self._plain.clear()
        self._last = None  # the restart is not a step
        self._next = self.steps + self.warmup
        self._burst = BURST

    def _replan_rank0(
        self, learn_and_replan: Any, measured: list[dict], inputs: ObservedInputs | None
    ) -> Any:
        try:
            config = self._planner.calibration_config()
            out = learn_and_replan(self._planner, measured, config, inputs)
        except Exception as exc:  # every rank raises it after the broadcast
            logger.exception("re-planning failed")
            return f"{type(exc).__name__}: {exc}"
        logger.info("re-plan: %s", out.decision["why"])
        return out.plan, out.observed, out.proposed, out.decision
