"""A task planned by :class:`~torchrec_dreamshard.planner.DreamShardPlanner` as the
benchmarks measure it (:func:`plan_whole_tables`): the one way the generalisation
benchmark's ``default`` method and the plan-budget benchmark run the planner.

The task becomes what ``dreamshard plan`` gives the planner
(:func:`~torchrec_dreamshard.planner.adapters.task_inputs.task_inputs`: the tables'
``EmbeddingBagCollection``, the CPU topology with the task's memory, the per-rank batch,
the pooling factors and the declared reuse), with every table held to table-wise on the
fused kernel (:func:`whole_table_constraints`; ``dreamshard plan --no-splits`` holds them
to table-wise, and the planner's enumerator picks the fused kernel for a table-wise CPU
table anyway): the measurement harness times whole tables on FBGEMM's fused kernel, so a
placement of whole tables, a device per table, is what it can measure. Everything else is
the planner's default, unless the caller says otherwise: its measuring (the profile step,
TorchRec's loop behind the measuring gate, the verification), its budget
(:data:`~torchrec_dreamshard.planner.steps.profile_step.FIRST_PLAN_BUDGET_S` for a plan with no
``timeout_seconds``), its enumerator and its type choice.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrec.distributed.planner.types import (
    ParameterConstraints,
    PlannerError,
    PlannerErrorType,
    StorageReservation,
)

from torchrec_dreamshard.data.tasks import NoPlanError, Task, placed_bytes
from torchrec_dreamshard.planner.adapters.task_inputs import TaskInputs, table_fqn, task_inputs
from torchrec_dreamshard.policy.protocol import PlacementAgent

WHOLE_TABLE = {"sharding_types": ["table_wise"], "compute_kernels": ["fused"]}
# the planner's errors that mean the tables do not fit: a placer's "no plan"
NO_PLAN_ERRORS = (
    PlannerErrorType.INSUFFICIENT_STORAGE,
    PlannerErrorType.STRICT_CONSTRAINTS,
    PlannerErrorType.PARTITION,
)


@dataclass(frozen=True)
class WholeTablePlan:
    """The planner's plan of a task's whole tables (:func:`plan_whole_tables`).

    Attributes:
        placement: the device of every table, in the task's order.
        unverified: the placement the policy chose in TorchRec's loop, before the
            verification step (``placement`` where nothing was verified, or where the
            verification kept the policy's choice).
        seconds: the wall seconds of ``plan()``, measuring included.
        adaptation: the planner's :attr:`~torchrec_dreamshard.planner.DreamShardPlanner.
            adaptation` (JSON-able: what it measured, spent, verified and skipped).
    """

    placement: list[int]
    unverified: list[int]
    seconds: float
    adaptation: dict[str, Any]


def whole_table_constraints(inputs: TaskInputs) -> dict[str, ParameterConstraints]:
    """``inputs``' constraints with every table held to table-wise on the fused kernel
    (:data:`WHOLE_TABLE`), the rest of each constraint kept."""
    return {name: dataclasses.replace(c, **WHOLE_TABLE) for name, c in inputs.constraints.items()}


def plan_whole_tables(
    task: Task,
    cache_dir: str | Path,
    *,
    agent: PlacementAgent | None = None,
    timeout_seconds: float | None = None,
    storage_reservation: StorageReservation | None = None,
    measure: bool = True,
) -> WholeTablePlan:
    """Plan ``task``'s whole tables with ``DreamShardPlanner`` (see the module docstring).

    Args:
        task: the task (its global batch must divide among its devices).
        cache_dir: the planner's ``cache_dir``: an empty directory makes the plan a first
            plan on this machine, measuring everything it measures from nothing.
        agent: the planner's ``agent`` (``None``: the bundled checkpoint, as a user gets).
        timeout_seconds: the planner's ``timeout_seconds`` (``None``: its default budget).
        storage_reservation: the planner's ``storage_reservation`` (``None``: TorchRec's
            default, which keeps its share of the task's memory).
        measure: the planner's ``measure``.

    Raises:
        NoPlanError: the planner found no plan that fits (TorchRec's ``PlannerError`` of
            insufficient storage, strict constraints or partitioning; its message kept).
        ValueError: the plan leaves a table off table-wise fused sharding, or the task's
            batch does not divide among its devices.
    """
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.planner.adapters.torchrec_adapter import quiet_torchrec

    inputs = task_inputs(task)
    arguments = inputs.planner_arguments()
    arguments["constraints"] = whole_table_constraints(inputs)
    planner = DreamShardPlanner(
        **arguments,
        storage_reservation=storage_reservation,
        timeout_seconds=timeout_seconds,
        agent=agent,
        measure=measure,
        cache_dir=cache_dir,
    )
    start = time.perf_counter()
    try:
        with quiet_torchrec():
            planner.plan(inputs.model, [EmbeddingBagCollectionSharder()])
    except PlannerError as exc:
        if exc.error_type not in NO_PLAN_ERRORS:
            raise
        raise NoPlanError(f"DreamShardPlanner found no plan: {planner_reason(exc)}") from exc
    seconds = time.perf_counter() - start
    placement = task_placement(task, planner.last_placement)
    return WholeTablePlan(
        placement, unverified(planner, task, placement), seconds, planner.adaptation
    )


def planner_reason(exc: PlannerError) -> str:
    """TorchRec's ``PlannerError`` in a line: its first line and, where it has one, the
    last planner error it names (DreamShard's message of what did not fit)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    marker = "Last planner error:"
    last = next((i for i, line in enumerate(lines) if line.startswith(marker)), None)
    if last is None:
        return lines[0]
    detail = " ".join(lines[last + 1 :]) or lines[last][len(marker) :].strip()
    return f"{lines[0]} {detail}".strip()


def task_placement(task: Task, ranks: dict[str, int], what: str = "the plan") -> list[int]:
    """The device of every table of ``task``, in its order, from ranks by fully qualified
    name (``planner.last_placement``: the tables it shards table-wise on the fused kernel).

    Raises:
        ValueError: a table is not in ``ranks`` (``what`` does not place it whole).
    """
    missing = [t.name for t in task.tables if table_fqn(t.name) not in ranks]
    if missing:
        raise ValueError(
            f"{what} places tables {missing} otherwise than whole (table-wise, fused kernel), "
            "though every table was held to it"
        )
    return [int(ranks[table_fqn(t.name)]) for t in task.tables]


def unverified(planner: Any, task: Task, placement: list[int]) -> list[int]:
    """The placement the policy chose in TorchRec's loop before the verification step
    (the verification's ``chosen``, by table), else ``placement``: nothing was verified.

    Raises:
        ValueError: the verified placement leaves out a table of ``task``.
    """
    verdict = planner.last_verdict
    outcome = verdict.outcome if verdict is not None else None
    if outcome is None or verdict.choice is None:
        return list(placement)
    names = (t.name for t in verdict.choice.task.tables)
    chosen = dict(zip(names, outcome.chosen, strict=True))
    return task_placement(task, chosen, "the verification's chosen placement")


def torchrec_table_storage(task: Task) -> list[int]:
    """TorchRec's storage estimate of each of ``task``'s tables held whole (table-wise on
    the fused kernel, as :func:`plan_whole_tables` holds them: weights, optimizer state,
    input and output buffers), in the task's order: the bytes the default planner counts
    a table as."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

    inputs = task_inputs(task)
    enumerator = EmbeddingEnumerator(
        inputs.topology, inputs.batch_size, constraints=whole_table_constraints(inputs)
    )
    options = enumerator.enumerate(inputs.model, [EmbeddingBagCollectionSharder()])
    need = {o.fqn: sum(int(s.storage.ddr) for s in o.shards) for o in options}
    return [need[table_fqn(t.name)] for t in task.tables]


def fits_torchrec_storage(task: Task, placement: list[int], storage: list[int]) -> bool:
    """Whether ``placement`` fits every device of ``task`` by TorchRec's ``storage``
    estimate of each table (:func:`torchrec_table_storage`), nothing reserved (the task's
    memory is what a reservation left): whether TorchRec's partitioner would accept it."""
    used = placed_bytes(storage, placement, task.num_devices)
    return all(u <= m for u, m in zip(used, task.memory, strict=True))
