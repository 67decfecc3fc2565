"""A task planned the way a user plans it (:func:`plan_as_user`): ``DreamShardPlanner``
exactly as ``dreamshard plan TASK`` builds it with no flags (the command's own parser and
:func:`~torchrec_dreamshard.cli.plan.task_planner`), TorchRec's ``get_default_sharders()``,
every sharding type TorchRec offers and TorchRec's storage contract (its default storage
reservation, then its storage estimate) on the task's memory, from an empty cache
(:func:`fresh_cache`: a fresh ``$XDG_CACHE_HOME``); and, beside it, what a TorchRec user
gets (:func:`torchrec_own_plan`: ``EmbeddingShardingPlanner`` on the same inputs) and the
heuristics held to the same memory contract (:func:`contract_memory`).

Unlike :mod:`harness.default_planning` (the generalisation benchmark's ``default``, which
holds every table whole and gives the task's memory as what a reservation left), nothing
here is added to what the user's command does; ``no_splits`` is ``dreamshard plan
--no-splits``.

A plan is a TorchRec ``ShardingPlan``; :func:`whole_placement` reads a device per table off
it where every table is table-wise on one rank (what the per-device kernel timer of
:mod:`harness.plan_measuring` measures); other plans are judged by the DMP step
(:mod:`torchrec_dreamshard.evaluation.dmp_step`). :func:`step_inputs` gives the same
planners the step timer's model (:class:`~torchrec_dreamshard.evaluation.step_model.StepDLRM`)
so that its plans train under ``DistributedModelParallel`` as they are.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.planner.adapters.task_inputs import TaskInputs, task_inputs

LOOSE_FACTOR = 4.0  # loose memory: each device this many times an even share of the weights
CACHE_ENV = ("XDG_CACHE_HOME", "DREAMSHARD_CALIBRATION_STORE")


@contextlib.contextmanager
def fresh_cache(path: str | Path | None = None) -> Iterator[Path]:
    """Within the block the package's caches start empty: ``$XDG_CACHE_HOME`` is a new
    temporary directory (or ``path``), and the variables that would send a cache
    elsewhere are unset; the environment is restored after, the directory deleted unless
    it was given."""
    saved = {k: os.environ.get(k) for k in CACHE_ENV}
    with contextlib.ExitStack() as stack:
        home = Path(path) if path else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        for key in CACHE_ENV:
            os.environ.pop(key, None)
        os.environ["XDG_CACHE_HOME"] = str(home)
        try:
            yield home
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def cli_arguments(no_splits: bool = False, timeout: float | None = None) -> Any:
    """``dreamshard plan TASK`` parsed by the command's own parser (``--no-splits`` and
    ``--timeout`` where asked): every other flag at the default a user gets."""
    from torchrec_dreamshard.cli import build_parser

    argv = ["plan", "TASK.json", *(["--no-splits"] if no_splits else [])]
    argv += [] if timeout is None else ["--timeout", str(timeout)]
    return build_parser().parse_args(argv)


def loose_task(task: Task, factor: float = LOOSE_FACTOR) -> Task:
    """``task`` at loose memory: every device ``factor`` x an even share of the tables'
    weights, and at least ``factor`` x the biggest table, so that no placement is
    memory-bound."""
    total = sum(t.size_bytes for t in task.tables)
    biggest = max(t.size_bytes for t in task.tables)
    each = int(math.ceil(max(factor * total / task.num_devices, factor * biggest)))
    return dataclasses.replace(task, memory_bytes=each)


def two_rank_task(task: Task, world: int = 2) -> Task:
    """``task``'s tables on ``world`` ranks at the same total memory (the same memory
    factor), for the DMP step timer's ranks."""
    each = int(sum(task.memory) // world)
    return dataclasses.replace(task, num_devices=world, memory_bytes=each, local_world_size=None)


def step_inputs(task: Task) -> TaskInputs:
    """What ``dreamshard plan`` gives the planner for ``task`` (:func:`task_inputs`), with
    the step timer's model in place of the tables' collection: the same topology, per-rank
    batch and constraints, the declared reuse and bag-length cvs keyed by table name."""
    from torchrec_dreamshard.evaluation.step_model import StepDLRM, StepModelSpec

    inputs = task_inputs(task)
    model = StepDLRM(StepModelSpec(bags=tuple(task.tables)), torch.device("meta"))
    reuse = {t.name: tuple(t.reuse_hist) for t in task.tables if t.reuse_hist}
    cvs = {t.name: t.bag_length_cv for t in task.tables if t.bag_length_cv is not None}
    return dataclasses.replace(inputs, model=model, reuse_hists=reuse, bag_length_cvs=cvs)


@dataclass
class UserPlan:
    """A plan made as a user makes it.

    Attributes:
        plan: TorchRec's ``ShardingPlan`` (``None``: no plan, ``error`` says why).
        tables: each table's sharding type, compute kernel and ranks
            (:func:`~torchrec_dreamshard.evaluation.dmp_step.table_shardings`).
        seconds: the wall seconds of ``plan()``.
        adaptation: ``planner.adaptation`` (DreamShard's planner only).
        verdict: the verification's verdict in words and numbers (:func:`verdict_record`).
        error: why there is no plan.
    """

    plan: Any
    tables: dict[str, dict[str, Any]]
    seconds: float
    adaptation: dict[str, Any] | None = None
    verdict: dict[str, Any] | None = None
    error: str | None = None

    def record(self) -> dict[str, Any]:
        """JSON-able, the plan itself left out."""
        out = dataclasses.asdict(self)
        out.pop("plan")
        return out


def _planned(planner: Any, inputs: TaskInputs) -> tuple[Any, float, str | None]:
    from torchrec.distributed.planner.types import PlannerError
    from torchrec.distributed.sharding_plan import get_default_sharders

    from torchrec_dreamshard.planner.adapters.torchrec_adapter import quiet_torchrec

    start = time.perf_counter()
    try:
        with quiet_torchrec():
            plan = planner.plan(inputs.model, get_default_sharders())
    except PlannerError as exc:  # the tables do not fit under the contract: no plan
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, time.perf_counter() - start, f"{exc.error_type.name}: {first}"
    return plan, time.perf_counter() - start, None


def plan_as_user(
    inputs: TaskInputs, no_splits: bool = False, timeout: float | None = None
) -> tuple[UserPlan, Any]:
    """``inputs`` planned by ``DreamShardPlanner`` as ``dreamshard plan TASK`` builds it
    (``--no-splits`` with ``no_splits``, ``--timeout`` with ``timeout``), in the caches the
    environment names (wrap it in :func:`fresh_cache` for a first plan). Returns the plan
    and the planner."""
    from torchrec_dreamshard.cli.plan import task_planner
    from torchrec_dreamshard.evaluation.dmp_step import table_shardings

    planner = task_planner(inputs, cli_arguments(no_splits, timeout))
    plan, seconds, error = _planned(planner, inputs)
    tables = table_shardings(plan) if plan is not None else {}
    record = UserPlan(plan, tables, seconds, planner.adaptation, verdict_record(planner), error)
    return record, planner


def torchrec_own_plan(inputs: TaskInputs) -> UserPlan:
    """TorchRec's ``EmbeddingShardingPlanner`` on ``inputs`` as a TorchRec user builds it:
    the same topology, batch and constraints, every sharding type, its default storage
    reservation and ``get_default_sharders()``."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    from torchrec_dreamshard.evaluation.dmp_step import table_shardings

    planner = EmbeddingShardingPlanner(
        topology=inputs.topology,
        batch_size=inputs.batch_size,
        constraints=dict(inputs.constraints),
        debug=False,
    )
    plan, seconds, error = _planned(planner, inputs)
    return UserPlan(plan, table_shardings(plan) if plan is not None else {}, seconds, error=error)


def verdict_record(planner: Any) -> dict[str, Any] | None:
    """What the last plan's verification measured and kept (``None``: no plan): its notes,
    whether it kept another plan than TorchRec's loop's, and the kept plan's and TorchRec's
    plan's measured step (ms) with their ratio, where both were measured."""
    verdict = planner.last_verdict
    if verdict is None:
        return None
    out: dict[str, Any] = {"notes": list(verdict.notes), "kept_other": verdict.kept is not None}
    ver = verdict.verification
    if ver is None or not ver.plans:
        return out
    kept, base = ver.winner, ver.baseline
    out["kept"] = {"name": kept.name, "placement": list(kept.placement), "ms": kept.measured_ms}
    if base is not None:
        out["torchrec"] = {"name": base.name, "placement": list(base.placement)}
        out["torchrec"]["ms"] = base.measured_ms
        if kept.measured_ms and base.measured_ms:
            out["ratio"] = kept.measured_ms / base.measured_ms
    if verdict.choice is not None:
        out["fqns"] = list(verdict.choice.fqns)
    return out


def whole_placement(task: Task, tables: dict[str, dict[str, Any]]) -> list[int] | None:
    """The device of every table of ``task``, in its order, where the plan holds every
    table table-wise on one rank (what the per-device kernel timer measures); else
    ``None``."""
    out = []
    for t in task.tables:
        entry = tables.get(t.name)
        if entry is None or entry["sharding_type"] != "table_wise" or len(entry["ranks"]) != 1:
            return None
        out.append(int(entry["ranks"][0]))
    return out


def type_counts(tables: dict[str, dict[str, Any]]) -> dict[str, int]:
    """How many tables use each sharding type."""
    from torchrec_dreamshard.evaluation.dmp_step import sharding_type_counts

    return sharding_type_counts(tables)


def contract_memory(inputs: TaskInputs) -> list[int]:
    """Each device's memory after TorchRec's default storage reservation on ``inputs``
    (``HeuristicalStorageReservation(0.15)``: on CPU ranks the 15% comes off HBM only, so
    DDR loses the input buffers' estimate): what TorchRec's storage estimate of the tables
    must fit in."""
    from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
    from torchrec.distributed.sharding_plan import get_default_sharders

    from torchrec_dreamshard.planner.adapters.torchrec_adapter import quiet_torchrec

    with quiet_torchrec():
        reserved = HeuristicalStorageReservation(percentage=0.15).reserve(
            inputs.topology,
            inputs.batch_size,
            inputs.model,
            get_default_sharders(),
            inputs.constraints,
        )
    return [int(d.storage.ddr if d.storage.hbm == 0 else d.storage.hbm) for d in reserved.devices]


def fits_contract(task: Task, placement: Sequence[int], inputs: TaskInputs) -> bool:
    """Whether a whole-table ``placement`` fits TorchRec's storage contract on ``task``'s
    memory: TorchRec's estimate of each table (table-wise, fused) within what its default
    storage reservation leaves of each device."""
    from torchrec_dreamshard.data.tasks import InsufficientMemoryError

    from harness.default_planning import fits_torchrec_storage, torchrec_table_storage

    memory = contract_memory(inputs)
    if min(memory) <= 0:  # the reservation's input buffers alone fill a device
        return False
    try:
        left = dataclasses.replace(task, memory_bytes=memory)
    except InsufficientMemoryError:  # what the reservation leaves cannot hold the tables
        return False
    return fits_torchrec_storage(left, list(placement), torchrec_table_storage(task))


def placement_sharding_plan(
    model: Any, names: Sequence[str], placement: Sequence[int], world: int
) -> Any:
    """A whole-table ``placement`` (a device per table of ``names``) as TorchRec's
    ``ShardingPlan`` of the step model's ``sparse`` collection: table-wise on the fused
    kernel, over ``world`` ranks."""
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import ShardingPlan

    per_table = {
        n: table_wise(rank=int(r), compute_kernel="fused")
        for n, r in zip(names, placement, strict=True)
    }
    module_plan = construct_module_sharding_plan(
        model.sparse,
        per_param_sharding=per_table,
        local_size=world,
        world_size=world,
        device_type="cpu",
    )
    return ShardingPlan({"sparse": module_plan})
