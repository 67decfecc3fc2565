"""Where our table specs become TorchRec objects and TorchRec's planner is read.

Every TorchRec member that is not public API is read here (and by the planner's
enumerator, which overrides ``EmbeddingEnumerator``'s filter hooks), against the version
below; a TorchRec upgrade starts by checking this module. The ``EmbeddingBagConfig`` of
each table (public API, shared with the measured models) and the topology a model is
planned on (:func:`torchrec_topology`) come from
:mod:`torchrec_dreamshard.measure.step_model`.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence

import torch
from torchrec.distributed import logger as torchrec_logger
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.storage_reservations import (
    FixedPercentageStorageReservation,
    HeuristicalStorageReservation,
    _get_batch_inputs_and_shardable_parameters,
    _get_dense_tensor_size,
)
from torchrec.distributed.planner.types import (
    ParameterConstraints,
    ShardingOption,
    Storage,
    StorageReservation,
    Topology,
)
from torchrec.distributed.types import ModuleSharder, ShardingPlan
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from torchrec_dreamshard.data.table_configs import embedding_bag_configs
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.planner.topology import torchrec_topology

TORCHREC_VERSION = "1.8.0"  # the TorchRec this module was written against (Makefile pins it)


def table_wise_constraints(tables: Sequence[TableSpec]) -> dict[str, ParameterConstraints]:
    """Table-wise sharding on the fused kernel (the placements we measure), with each
    table's pooling factor."""
    return {
        t.name: ParameterConstraints(
            sharding_types=["table_wise"],
            compute_kernels=["fused"],
            pooling_factors=[t.pooling_factor],
        )
        for t in tables
    }


def heuristical_reservation(
    model: torch.nn.Module | None,
    sharders: Sequence[ModuleSharder[torch.nn.Module]],
    percentage: float = 0.15,
) -> HeuristicalStorageReservation:
    """The storage reservation a TorchRec planner builds when given none
    (``HeuristicalStorageReservation(percentage)``), with its ``dense_tensor_estimate``
    set to the bytes it would reserve for ``model``'s dense part anyway
    (:func:`fill_dense_estimate`; ``model=None``: set later, when the model is known).

    Args:
        model: the model the planner will plan (on any device, ``meta`` included).
        sharders: the sharders the planner will be given.
        percentage: TorchRec's ``heuristical_storage_reservation_percentage``.
    """
    with warnings.catch_warnings():
        # Its constructor recommends passing a dense_tensor_estimate, which we do.
        warnings.filterwarnings("ignore", "HeuristicalStorageReservation", FutureWarning)
        reservation = HeuristicalStorageReservation(percentage)
    if model is not None:
        fill_dense_estimate(reservation, model, sharders)
    return reservation


def fill_dense_estimate(
    reservation: HeuristicalStorageReservation,
    model: torch.nn.Module,
    sharders: Sequence[ModuleSharder[torch.nn.Module]],
) -> None:
    """Set ``reservation``'s ``dense_tensor_estimate`` to what it reserves for ``model``'s
    dense part anyway: 6 x the bytes of the parameters outside the modules ``sharders``
    shard, plus their buffers. TorchRec 1.8 computes that from shapes and dtypes only, so
    it is exact on the meta device too, but without an estimate it logs a "known issue
    ... in dry run scenarios" warning on every plan. The reservation means the same with
    it, and TorchRec does not warn (it still does when the estimate is 0, a model with no
    dense part; nothing is wrong then either)."""
    _, shardable = _get_batch_inputs_and_shardable_parameters(model, list(sharders), 1)
    # 6.0: HeuristicalStorageReservation's parameter_multiplier (parameter, optimizer, DDP)
    estimate = _get_dense_tensor_size(model, shardable, multiplier=6.0)
    reservation._dense_tensor_estimate = estimate  # TorchRec's constructor argument


def reserved_topology(reservation: StorageReservation | None, topology: Topology) -> Topology:
    """The topology left after the storage reservation's last reservation, or
    ``topology`` when nothing was reserved yet."""
    reserved = reservation.last_reserved_topology if reservation else None
    return reserved if reserved is not None else topology


def planner_reserved_topology(planner: EmbeddingShardingPlanner) -> Topology:
    """What a planner's storage reservation left of its topology (after ``plan``)."""
    return reserved_topology(planner._storage_reservation, planner._topology)


def planner_best_plan(planner: EmbeddingShardingPlanner) -> list[ShardingOption] | None:
    """The sharding options of the plan a planner chose last (with their ranks; ``None``
    before it planned)."""
    return planner._best_plan


def _plan_without_method_log() -> Callable[..., ShardingPlan] | None:
    """``EmbeddingShardingPlanner.plan`` as TorchRec 1.8 declares it, less its method log.

    TorchRec decorates ``plan`` twice: ``EventLoggingHandler.event_logger(PLANNER)``
    around ``_torchrec_method_logger()``, around the planning loop. This is the loop under
    the same event logger (rebuilt with the arguments read off TorchRec's own), or
    ``None`` when the decorators are not those two: then nothing is skipped."""
    outer = EmbeddingShardingPlanner.plan
    logged = getattr(outer, "__wrapped__", None)
    body = getattr(logged, "__wrapped__", None)
    if body is None or hasattr(body, "__wrapped__"):
        return None
    if logged.__code__ is not torchrec_logger._torchrec_method_logger()(body).__code__:
        return None
    cells = outer.__closure__ or ()
    closure = {k: c.cell_contents for k, c in zip(outer.__code__.co_freevars, cells, strict=True)}
    event_logger = getattr(closure.get("cls"), "event_logger", None)
    if closure.get("func") is not logged or event_logger is None:
        return None
    arguments = ("component", "prefix", "n", "add_wait_counter")
    if not set(arguments) <= set(closure):
        return None
    rebuilt = event_logger(**{k: closure[k] for k in arguments})(body)
    return rebuilt if rebuilt.__code__ is outer.__code__ else None


PLAN_WITHOUT_METHOD_LOG = _plan_without_method_log()


def method_log_is_read() -> bool:
    """Whether a record of TorchRec's method logger reaches a handler that writes it:
    one that is not a ``NullHandler`` on the logger or, while it propagates, its parents;
    or Python's last-resort handler when there is no handler at all (open-source TorchRec
    gives it a ``NullHandler`` and no propagation: nothing reads it)."""
    logger: logging.Logger | None = torchrec_logger.method_logger
    found = False
    while logger is not None:
        if any(not isinstance(h, logging.NullHandler) for h in logger.handlers):
            return True
        found = found or bool(logger.handlers)
        logger = logger.parent if logger.propagate else None
    return not found and logging.lastResort is not None


def torchrec_plan(
    planner: EmbeddingShardingPlanner,
    module: torch.nn.Module,
    sharders: list[ModuleSharder[torch.nn.Module]],
) -> ShardingPlan:
    """TorchRec's ``EmbeddingShardingPlanner.plan`` on ``planner``: its planning loop,
    storage reservation, stats, callbacks, validation, plan loading and errors, under its
    event logger. Its method log (the ``str`` of the planner, the whole model, the sharders
    and the plan: 0.05-0.06 s of a plan of 1000 tables) is skipped where nothing reads it
    (:func:`method_log_is_read`), and kept where something does or where TorchRec's
    decorators differ from those :func:`_plan_without_method_log` knows."""
    if PLAN_WITHOUT_METHOD_LOG is None or method_log_is_read():
        return EmbeddingShardingPlanner.plan(planner, module, sharders)
    return PLAN_WITHOUT_METHOD_LOG(planner, module, sharders)


def plan_ranks(plan: ShardingPlan) -> dict[str, int]:
    """The rank of every table of a table-wise plan (its first shard's rank)."""
    return {
        name: int(param.sharding_spec.shards[0].placement.rank())
        for module_plan in plan.plan.values()
        for name, param in module_plan.items()
    }


@contextlib.contextmanager
def quiet_torchrec() -> Iterator[None]:
    """Silence TorchRec's planner warnings about dry-run topologies while planning."""
    logger = logging.getLogger("torchrec.distributed.planner")
    before = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(before)


class WeightsOnlyEnumerator(EmbeddingEnumerator):
    """TorchRec's enumerator with each shard's storage set to the table's bytes.

    Args:
        sizes: bytes of each table, by name.
    """

    def __init__(self, *args, sizes: dict[str, int], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._sizes = sizes

    def enumerate(self, module, sharders):
        options = super().enumerate(module, sharders)
        for option in options:
            for shard in option.shards:
                shard.storage = Storage(hbm=0, ddr=self._sizes[option.name])
        return options


def plan_with_torchrec(task: Task, weights_only: bool = False) -> dict[str, int]:
    """TorchRec's ``EmbeddingShardingPlanner`` on ``task``, table-wise fused only; the rank
    of every table it placed (planned by :func:`torchrec_plan`).

    Args:
        task: the task (its batch is the global batch; TorchRec gets ``B / D`` per rank).
        weights_only: a table costs its weights' bytes and nothing is reserved (our memory
            accounting) instead of TorchRec's defaults.

    Raises:
        PlannerError: TorchRec's planner found no plan.
    """
    ebc = EmbeddingBagCollection(
        tables=embedding_bag_configs(task.tables), device=torch.device("meta")
    )
    constraints = table_wise_constraints(task.tables)
    topology = torchrec_topology(task.num_devices, "cpu", ddr_cap=max(task.memory))
    for dev, cap in zip(topology.devices, task.memory, strict=True):
        dev.storage.ddr = int(cap)
    kwargs = {}
    if weights_only:
        kwargs["enumerator"] = WeightsOnlyEnumerator(
            topology,
            batch_size=task.batch_size,
            constraints=constraints,
            sizes={t.name: t.size_bytes for t in task.tables},
        )
        kwargs["storage_reservation"] = FixedPercentageStorageReservation(0.0)
    with quiet_torchrec():
        planner = EmbeddingShardingPlanner(
            topology=topology,
            batch_size=max(1, task.batch_size // task.num_devices),
            constraints=constraints,
            debug=False,
            **kwargs,
        )
        return plan_ranks(torchrec_plan(planner, ebc, [EmbeddingBagCollectionSharder()]))


@contextlib.contextmanager
def enumerate_without_stored_copy() -> Iterator[None]:
    """Inside, ``EmbeddingEnumerator.enumerate`` keeps the options it returns as its
    stored search space instead of a deep copy of them. DreamShard's enumerator discards
    TorchRec's stored copy (it stores its own, of the options it finally offers), and
    that deep copy is seconds at scale (300 tables on 64 ranks: every data-parallel and
    row-wise option has a shard per rank). TorchRec 1.8 copies with ``copy.deepcopy`` in
    ``torchrec.distributed.planner.enumerators``; this swaps that module's ``copy`` for a
    stand-in whose ``deepcopy`` returns a list (the search space) as it is and copies
    anything else (the constraints' cache and key-value parameters it also copies) as
    ``copy.deepcopy`` does, and restores it on exit."""
    from types import SimpleNamespace

    from torchrec.distributed.planner import enumerators

    before = enumerators.copy

    def deepcopy(x, memo=None):
        return x if isinstance(x, list) else before.deepcopy(x, memo)

    enumerators.copy = SimpleNamespace(deepcopy=deepcopy, copy=before.copy)
    try:
        yield
    finally:
        enumerators.copy = before
