"""Sharding plans judged by the training step: real ``DistributedModelParallel`` steps
under ``TrainPipelineSparseDist`` on gloo ranks, plan against plan, in alternating rounds.

A plan is a TorchRec ``ShardingPlan`` or a planner factory
``factory(topology, batch_size, constraints)`` whose planner runs on rank 0.
:func:`time_plans` spawns the ranks; :func:`run_rounds` is every rank's body (as is under
``torchrun``).
"""

from __future__ import annotations

import json
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from torchrec_dreamshard.evaluation.step_model import (
    StepBatch,
    StepDLRM,
    StepModelSpec,
    make_batch,
)
from torchrec_dreamshard.measure.dmp_training import sharded_for_training, timed_steps
from torchrec_dreamshard.measure.rounds import balanced_order, measure_in_rounds
from torchrec_dreamshard.planner.adapters.topology import torchrec_topology
from torchrec_dreamshard.ranks.spawn import exit_spawned_rank, free_port, local_process_group

PlanSource = Any  # a torchrec ShardingPlan, or a planner factory (see the module docstring)
DRAIN_STEPS = 2  # untimed steps after the timed ones: the pipeline holds two batches ahead


@dataclass(frozen=True, kw_only=True)
class StepTimerConfig:
    """How the step timer runs.

    Attributes:
        batch_size: samples per rank per step (TorchRec's per-rank ``batch_size``).
        warmup_steps, steps: untimed, then timed steps of a plan in each round.
        distinct_batches: batches drawn per rank (cycled through the steps).
        lr: learning rate of both optimizers.
        first_round: index of the first round (a resumed run continues the order).
        timeout_s: seconds after which spawned ranks are ended (``None``: no limit).
    """

    batch_size: int = 512
    rounds: int = 10
    warmup_steps: int = 3
    steps: int = 10
    distinct_batches: int = 4
    lr: float = 0.01
    seed: int = 0
    first_round: int = 0
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("batch_size", "rounds", "steps", "distinct_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("warmup_steps", "first_round"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive or None, got {self.timeout_s!r}")


@dataclass(kw_only=True)
class StepTimes:
    """What the step timer measured.

    Attributes:
        world_size: ranks.
        config: the :class:`StepTimerConfig`, as a dict.
        plans: per plan, each table's ``sharding_type``, ``compute_kernel`` and ``ranks``,
            and ``pipelined`` (modules whose input distribution the pipeline overlaps).
        rounds: per round ``{"round": r, "order": [plan, ...], "step_ms": {plan: ms}}``.
    """

    world_size: int
    config: dict[str, Any]
    plans: dict[str, dict[str, Any]]
    rounds: list[dict[str, Any]] = field(default_factory=list)

    def step_ms(self, name: str) -> list[float]:
        """The plan's step time in each round (ms)."""
        return [float(r["step_ms"][name]) for r in self.rounds]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepTimes:
        return cls(**dict(data))


class StepTimerError(RuntimeError):
    """A rank of the step timer failed or the run timed out."""


# -- plans ---------------------------------------------------------------------------------


def make_plan(spec: StepModelSpec, source: PlanSource, world: int, batch_size: int):
    """``source`` if it is a ``ShardingPlan``, else its planner's plan of the model on a
    ``world``-rank CPU topology; checked by :func:`check_plan`."""
    from torchrec.distributed.sharding_plan import get_default_sharders
    from torchrec.distributed.types import ShardingPlan

    if isinstance(source, ShardingPlan):
        plan = source
    elif callable(source):
        topology = torchrec_topology(world, "cpu")
        planner = source(topology, batch_size, spec.planner_constraints())
        plan = planner.plan(StepDLRM(spec, torch.device("meta")), get_default_sharders())
    else:
        raise ValueError(
            f"a plan must be a torchrec ShardingPlan or a planner factory, got {source!r}"
        )
    check_plan(spec, plan, world)
    return plan


def check_plan(spec: StepModelSpec, plan: Any, world: int) -> None:
    """Raise ``ValueError`` unless ``plan`` places every table of ``spec``, and only those,
    on ranks ``0..world-1``."""
    summary = table_shardings(plan)
    missing = sorted({t.name for t in spec.tables} - set(summary))
    unknown = sorted(set(summary) - {t.name for t in spec.tables})
    if missing or unknown:
        raise ValueError(f"the plan leaves out tables {missing} and has unknown ones {unknown}")
    for name, entry in summary.items():
        bad = [r for r in entry["ranks"] if not 0 <= r < world]
        if bad:
            raise ValueError(f"table {name!r} is on ranks {bad}, outside 0..{world - 1}")


def resolve_plans(
    spec: StepModelSpec, plans: Mapping[str, PlanSource], batch_size: int
) -> dict[str, Any]:
    """Every plan as a ``ShardingPlan`` on every rank: factories run on rank 0, whose plans
    (or first error) are broadcast."""
    world, rank = dist.get_world_size(), dist.get_rank()
    payload: list[Any] = [None]
    if rank == 0:
        resolved, error = {}, None
        for name, source in plans.items():
            try:
                resolved[name] = make_plan(spec, source, world, batch_size)
            except Exception as exc:  # sent to every rank, raised there
                error = f"plan {name!r} (on rank 0): {type(exc).__name__}: {exc}"
                break
        payload = [(resolved, error)]
    dist.broadcast_object_list(payload, src=0)
    resolved, error = payload[0]
    if error is not None:
        raise ValueError(error)
    return resolved


def table_shardings(plan: Any) -> dict[str, dict[str, Any]]:
    """Each table's sharding type, compute kernel and ranks in a ``ShardingPlan``, by name."""
    return {
        name: {
            "sharding_type": ps.sharding_type,
            "compute_kernel": ps.compute_kernel,
            "ranks": list(ps.ranks or []),
        }
        for module_plan in plan.plan.values()
        for name, ps in module_plan.items()
    }


def sharding_type_counts(tables: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """How many tables of a :func:`table_shardings` use each sharding type (sorted by type)."""
    counts: dict[str, int] = {}
    for entry in tables.values():
        counts[entry["sharding_type"]] = counts.get(entry["sharding_type"], 0) + 1
    return dict(sorted(counts.items()))


# -- one rank's work -----------------------------------------------------------------------


def build_pipeline(spec: StepModelSpec, plan: Any, lr: float):
    """The model under ``DistributedModelParallel`` with ``plan`` (fused row-wise Adagrad on
    the embeddings, Adagrad on the rest) in a ``TrainPipelineSparseDist``."""
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    model = StepDLRM(spec, torch.device("meta"))
    dmp, optimizer = sharded_for_training(model, plan, lr, ("sparse.", "sequences."))
    return TrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"))


def time_round(pipeline: Any, batches: Sequence[StepBatch], warmup: int, steps: int) -> float:
    """One run of a plan: ``warmup`` steps, ``steps`` timed steps, the pipeline drained;
    the mean timed step in ms, the maximum over ranks."""
    n = warmup + steps + DRAIN_STEPS
    stream = iter([batches[i % len(batches)] for i in range(n)])
    return timed_steps(lambda: pipeline.progress(stream), warmup, steps, DRAIN_STEPS)


def run_rounds(
    spec: StepModelSpec,
    plans: Mapping[str, PlanSource],
    config: StepTimerConfig,
    round_log: str | Path | None = None,
) -> StepTimes:
    """The step timer on this rank of an initialised process group (every rank calls it
    and returns the same times); rank 0 appends each round to ``round_log``."""
    from torchrec_dreamshard.torchrec_compat import pipelined_modules

    if not plans:
        raise ValueError("no plans to time")
    torch.set_num_threads(1)
    resolved = resolve_plans(spec, plans, config.batch_size)
    pipelines = {}
    for name, plan in resolved.items():
        try:
            pipelines[name] = build_pipeline(spec, plan, config.lr)
        except Exception as exc:
            raise RuntimeError(f"plan {name!r}: building its DMP model failed: {exc}") from exc
    rank = dist.get_rank()
    base = config.seed * 1_000_003 + rank * 10_007
    batches = [
        make_batch(spec, config.batch_size, base + i) for i in range(config.distinct_batches)
    ]
    times = StepTimes(
        world_size=dist.get_world_size(),
        config=asdict(config),
        plans={name: {"tables": table_shardings(plan)} for name, plan in resolved.items()},
    )
    first = config.first_round

    def step(_: int, name: str) -> float:
        return time_round(pipelines[name], batches, config.warmup_steps, config.steps)

    def kept(_: int, r: int, step_ms: dict[str, float]) -> None:
        times.rounds.append({"round": first + r, "order": list(step_ms), "step_ms": step_ms})
        if rank == 0 and round_log is not None:
            with open(round_log, "a") as f:
                f.write(json.dumps(times.rounds[-1]) + "\n")

    measure_in_rounds(
        [list(resolved)],
        step,
        config.rounds,
        on_group=kept,
        order=lambda n, r: balanced_order(n, first + r),
    )
    for name, pipeline in pipelines.items():
        times.plans[name]["pipelined"] = len(pipelined_modules(pipeline))
    return times


def _spawned_rank(rank: int, world: int, port: int, job: tuple) -> None:
    spec, plans, config, round_log, out = job
    warnings.filterwarnings("ignore")
    with local_process_group(rank, world, port):
        times = run_rounds(spec, plans, config, round_log)
        if rank == 0:
            Path(out).write_text(json.dumps(times.to_dict()))
    exit_spawned_rank()


# -- the caller ----------------------------------------------------------------------------


def time_plans(
    spec: StepModelSpec,
    plans: Mapping[str, PlanSource],
    world_size: int = 2,
    config: StepTimerConfig | None = None,
    round_log: str | Path | None = None,
) -> StepTimes:
    """Time ``plans`` on ``world_size`` gloo ranks spawned on this machine (CPU).

    Args:
        plans: name -> ``ShardingPlan`` or planner factory (picklable: a module-level
            function or class, not a lambda).
        round_log: a file rank 0 appends each finished round to (JSON lines).

    Raises:
        StepTimerError: a rank failed (its error in the message) or ``timeout_s`` passed.
    """
    import torch.multiprocessing as mp

    config = config or StepTimerConfig()
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if not plans:
        raise ValueError("no plans to time")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        job = (spec, dict(plans), config, None if round_log is None else str(round_log), str(out))
        context = mp.spawn(
            _spawned_rank, args=(world_size, free_port(), job), nprocs=world_size, join=False
        )
        _join(context, config.timeout_s)
        return StepTimes.from_dict(json.loads(out.read_text()))


def _join(context: Any, timeout_s: float | None) -> None:
    """Wait for every spawned rank; a failure or the deadline ends them all and raises."""
    import torch.multiprocessing as mp

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while not context.join(timeout=1.0):
            if deadline is not None and time.monotonic() > deadline:
                raise StepTimerError(f"the step timer's ranks did not finish in {timeout_s:g} s")
    except mp.ProcessRaisedException as exc:
        text = str(exc).strip()
        last = text.splitlines()[-1] if text else type(exc).__name__
        raise StepTimerError(f"rank {exc.error_index} failed: {last}\n\n{text}") from None
    except mp.ProcessExitedException as exc:
        raise StepTimerError(f"rank {exc.error_index} exited: {exc}") from None
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
