"""How the observer samples: :class:`StepSampler` picks the steps run under the profiler,
spaced so sampling stays within its share of the job's time."""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import statistics
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from torchrec_dreamshard.feedback.inputs import InputRecorder
from torchrec_dreamshard.feedback.profiling import MARK, StepProfile, step_profile
from torchrec_dreamshard.feedback.rank_memory import MemoryRecorder, transient_peak
from torchrec_dreamshard.ranks.job_group import JobGroup

EVERY = 20  # sample at most one step in this many
WARMUP = 5  # steps before the first sample (allocations, caches, autotuning)
MAX_SAMPLES = 64  # sampled steps kept (the newest); their events are read at report()
MAX_OVERHEAD = 0.01  # the share of the job's time sampling may cost (the target is 2%)
PLAIN_STEPS = 64  # plain (unsampled) step times kept, for the baseline of a sampled one
EXTRAS = 5  # the last samples' costs whose median sets the interval (one outlier does not)
LONG_STEP = 10.0  # a sampled "step" this many plain steps long spans a pause: dropped
BURST = 4  # the first samples of a job (or of a followed restart) come closer together,
BURST_EVERY = 5  # one step in this many: a re-plan soon after the start has a few to learn from
MEMORY_EVERY = 4  # one sample in this many also records allocations (the step's peak)


def sampling_interval(extra_ms: float, step_ms: float, every: int, max_overhead: float) -> int:
    """Steps between samples: at least ``every``, and enough that ``extra_ms`` per sample
    over ``step_ms`` steps stays within ``max_overhead``."""
    if step_ms <= 0 or extra_ms <= 0:
        return every
    return max(every, math.ceil(extra_ms / (max_overhead * step_ms)))


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """File descriptor 2 on /dev/null for the block (silences C++ prints)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


_OPEN: weakref.WeakSet[StepSampler] = weakref.WeakSet()  # samplers with a sample running


@atexit.register
def _close_open_samples() -> None:
    """Stop every sample still running when the process exits (see ``close``)."""
    for sampler in list(_OPEN):
        sampler.close()


class StepSampler:
    """Which steps of a job run under ``torch.profiler`` (the same on every rank, agreed by
    one small all-reduce a sample), and what that costs; other steps cost a clock read.

    Args:
        group: the job's process group.
        dmp: the job's ``DistributedModelParallel`` (``None``: no inputs recorded).
        every: sample at most one step in ``every``.
        warmup: steps before the first sample.
        max_overhead: the share of the job's time sampling may cost (``None``: no limit).
        clock: the clock the steps are timed by, in seconds.
    """

    def __init__(
        self,
        group: JobGroup,
        dmp: Any,
        every: int = EVERY,
        warmup: int = WARMUP,
        max_overhead: float | None = MAX_OVERHEAD,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if every < 1 or warmup < 0:
            raise ValueError(f"every must be >= 1 and warmup >= 0, got {every}, {warmup}")
        if max_overhead is not None and not 0 < max_overhead < 1:
            raise ValueError(f"max_overhead must be in (0, 1) or None, got {max_overhead!r}")
        self._group = group
        self.clock = clock
        self.every, self.warmup, self.max_overhead = every, warmup, max_overhead
        self.steps = 0
        self.interval = every  # steps between samples now (see sampling_interval)
        self._next = warmup  # the step count at which the next sample starts
        self._first: float | None = None  # the clock at the first step() call
        self._last: float | None = None  # the clock at the end of the last step() call
        self._entered = 0.0  # the clock before the open sample's profiler started
        self._plain: deque[float] = deque(maxlen=PLAIN_STEPS)  # plain steps' ms
        self._extra_ms = 0.0  # what sampling cost so far
        self._extras: deque[float] = deque(maxlen=EXTRAS)  # the last kept samples' costs
        self.dropped = 0  # samples that spanned a pause, dropped
        self._burst = BURST  # samples still to take at the burst's spacing
        self._samples: deque[Any] = deque(maxlen=MAX_SAMPLES)  # raw, read when gathered
        self._profiler: Any = None
        self._started = (0.0, 0.0)  # the clock and wall clock at the sampled step's start
        self.inputs = InputRecorder(dmp)  # what the sampled steps feed the tables
        self.memory = MemoryRecorder(dmp)  # what the ranks hold (named by attach(plan))
        self._memory_sampled = 0  # samples started, for MEMORY_EVERY
        self._start_sample()  # the profiler's first start takes ~1 s: not in a training step
        self.close()
        self._memory_sampled = 0  # the job's first sample records allocations

    def step(self) -> None:
        """Call once after every training step."""
        now = self.clock()
        if self._first is None:
            self._first = now
        if self._profiler is not None:
            self._finish_sample()
        elif self._last is not None:
            self._plain.append((now - self._last) * 1e3)
        self.steps += 1
        if self.steps >= self._next:
            self._start_sample()
        self._last = self.clock()

    @property
    def sampling(self) -> bool:
        """Whether a sample is open (the step now running is sampled)."""
        return self._profiler is not None

    @property
    def sampling_ms(self) -> float:
        """Ms sampling cost this rank so far, beyond the median plain step."""
        return self._extra_ms

    @property
    def overhead(self) -> float:
        """The share of the job's time sampling cost this rank so far."""
        if self._first is None or self._last is None:
            return 0.0
        base = (self._last - self._first) * 1e3 - self._extra_ms
        return self._extra_ms / base if base > 0 else 0.0

    @property
    def sampled_steps(self) -> int:
        """How many sampled steps are kept."""
        return len(self._samples)

    def _start_sample(self) -> None:
        from torch.profiler import ProfilerActivity, profile, record_function

        activities = [ProfilerActivity.CPU]
        if self._group.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        for other in list(_OPEN):  # one profiler at a time: nested ones crash at exit
            other.close()
        self._entered = self.clock()
        # allocations on one sample in MEMORY_EVERY (the first included): they cost more
        memory = self._memory_sampled % MEMORY_EVERY == 0
        self._memory_sampled += 1
        self._profiler = profile(activities=activities, profile_memory=memory)
        _OPEN.add(self)
        with quiet_stderr():  # Kineto prints two lines to stderr per start and stop
            self._profiler.__enter__()
        with record_function(MARK):
            self._started = (self.clock(), time.time())
        self.inputs.start()
        self.memory.start(self._group.device)

    def _finish_sample(self) -> None:
        if self._group.device.type == "cuda":
            torch.cuda.synchronize(self._group.device)
        step_ms = (self.clock() - self._started[0]) * 1e3
        profiler = self._profiler
        plain = statistics.median(self._plain) if self._plain else None
        # a "step" far longer than plain ones spans a pause: dropped on every rank if on any
        long = plain is not None and len(self._plain) >= 5 and step_ms > LONG_STEP * plain
        fed = self.inputs.take()
        self.memory.recording = False
        self.close()
        # what the sample cost: the step with the profiler's start and stop, less a plain step
        cost_ms = (self.clock() - self._entered) * 1e3
        extra = max(0.0, cost_ms - (plain if plain is not None else cost_ms))
        wanted = self.every
        if not long:
            self._extras.append(extra)
        if self.max_overhead is not None and self._extras:
            typical = statistics.median(self._extras)
            wanted = sampling_interval(typical, plain or cost_ms, self.every, self.max_overhead)
        self.interval, dropped = self._agreed(wanted, long)
        self.memory.finish(self._group.device, keep=not dropped)
        if dropped:
            self._extra_ms += statistics.median(self._extras) if self._extras else 0.0
            self.dropped += 1
        else:
            self._samples.append((profiler, step_ms, self._started[1]))
            self.inputs.keep(fed)
            self._extra_ms += extra
            self._burst -= 1
        burst = self._burst > 0  # the same on every rank: the kept samples are agreed
        self._next = self.steps + (min(self.every, BURST_EVERY) if burst else self.interval)

    def _agreed(self, interval: int, drop: bool) -> tuple[int, bool]:
        """The longest interval any rank wants and whether any drops the sample (collective:
        every rank keeps the same samples, so their all-to-alls pair up)."""
        value = torch.tensor([interval, int(drop)], dtype=torch.int64, device=self._group.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self._group.pg)
        return int(value[0].item()), bool(value[1].item())

    @property
    def profiles(self) -> list[StepProfile]:
        """This rank's newest :data:`MAX_SAMPLES` sampled steps, read from their events now."""
        out = []
        for i, sample in enumerate(self._samples):
            if not isinstance(sample, StepProfile):
                profiler, step_ms, wall = sample
                events = profiler.events()
                sample = step_profile(events, step_ms, wall)
                sample.peak_bytes = transient_peak(events, self._group.device.type == "cuda")
                self._samples[i] = sample
            out.append(sample)
        return out

    def clear(self) -> None:
        """Drop the samples kept (they measured a plan no longer run)."""
        self._samples.clear()
        self.memory.clear()

    def restart(self, dmp: Any) -> None:
        """Sample ``dmp``, a job restarted in this process, as a new job."""
        self.close()
        self.inputs.attach(dmp)
        self.memory.attach(dmp)
        self.memory.clear()
        self._memory_sampled = 0
        self._samples.clear()
        self.inputs.steps.clear()
        self._plain.clear()
        self._last = None  # the restart is not a step
        self._next = self.steps + self.warmup
        self._burst = BURST

    def close(self) -> None:
        """Drop a sample still open (at exit too: a running profiler crashes the teardown)."""
        self.inputs.stop(keep=False)
        self.memory.recording = False
        if self._profiler is not None:
            with quiet_stderr():
                self._profiler.__exit__(None, None, None)
            self._profiler = None
        _OPEN.discard(self)
