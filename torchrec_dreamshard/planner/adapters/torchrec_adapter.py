"""Where our table specs become TorchRec objects and TorchRec's planner is read.

The TorchRec internals these read (the planner's chosen plan, topology and reservation,
the storage reservation's dense estimate) are reached through
:mod:`torchrec_dreamshard.torchrec_compat`, which checks them against the installed
release. The ``EmbeddingBagConfig`` of each table (public API, shared with the measured
models) comes from :mod:`torchrec_dreamshard.data.table_configs`, and the topology a model
is planned on (:func:`torchrec_topology`) from :mod:`torchrec_dreamshard.planner.adapters.topology`.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Sequence
from typing import Literal, get_args

import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.storage_reservations import (
    FixedPercentageStorageReservation,
    HeuristicalStorageReservation,
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
from torchrec_dreamshard.data.task_fields import per_rank_batch
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.planner.adapters.topology import torchrec_topology
from torchrec_dreamshard.torchrec_compat import (
    best_plan,
    dense_tensor_estimate,
    planner_storage_reservation,
    planner_topology,
    set_dense_tensor_estimate,
)

# how TorchRec's planner counts a table's memory (see plan_with_torchrec)
Accounting = Literal["torchrec", "unreserved", "weights"]
ACCOUNTINGS: tuple[str, ...] = get_args(Accounting)


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
    shard, plus their buffers. TorchRec (1.8, 1.9) computes it from shapes and dtypes only, so
    it is exact on the meta device too, but without an estimate it logs a "known issue
    ... in dry run scenarios" warning on every plan. The reservation means the same with
    it, and TorchRec does not warn (it still does when the estimate is 0, a model with no
    dense part; nothing is wrong then either)."""
    # 6.0: HeuristicalStorageReservation's parameter_multiplier (parameter, optimizer, DDP)
    estimate = dense_tensor_estimate(model, list(sharders), multiplier=6.0)
    set_dense_tensor_estimate(reservation, estimate)  # TorchRec's constructor argument


def reserved_topology(reservation: StorageReservation | None, topology: Topology) -> Topology:
    """The topology left after the storage reservation's last reservation, or
    ``topology`` when nothing was reserved yet."""
    reserved = reservation.last_reserved_topology if reservation else None
    return reserved if reserved is not None else topology


def planner_reserved_topology(planner: EmbeddingShardingPlanner) -> Topology:
    """What a planner's storage reservation left of its topology (after ``plan``)."""
    return reserved_topology(planner_storage_reservation(planner), planner_topology(planner))


def planner_best_plan(planner: EmbeddingShardingPlanner) -> list[ShardingOption]:
    """The sharding options of the plan a planner chose last (with their ranks)."""
    plan = best_plan(planner)
    if plan is None:
        raise ValueError("the planner has not planned yet")
    return plan


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


def plan_with_torchrec(
    task: Task, accounting: Accounting = "torchrec", compute_device: str = "cpu"
) -> dict[str, int]:
    """TorchRec's ``EmbeddingShardingPlanner`` on ``task``, table-wise fused only; the rank
    of every table it placed.

    Args:
        task: the task (its batch is the global batch; TorchRec gets ``B / D`` per rank).
        accounting: how a table's memory is counted against the task's memory:
            ``"torchrec"``, TorchRec's defaults (its storage estimate of weights, optimizer
            state and I/O buffers, and its 15% heuristic reservation: the task's memory is
            the devices' whole memory); ``"unreserved"``, TorchRec's storage estimate with
            nothing reserved (the task's memory is what a storage reservation left);
            ``"weights"``, a table costs its weights' bytes and nothing is reserved (our
            accounting).
        compute_device: the topology's device, ``"cpu"`` (the task's memory is each
            device's DDR) or ``"cuda"`` (its HBM; TorchRec prices CUDA kernels and links,
            and needs no GPU to plan for them).

    Raises:
        PlannerError: TorchRec's planner found no plan.
        ValueError: ``accounting`` is none of the three, or the global batch does not
            divide evenly among the devices.
    """
    if accounting not in ACCOUNTINGS:
        raise ValueError(f"accounting must be one of {ACCOUNTINGS}, got {accounting!r}")
    ebc = EmbeddingBagCollection(
        tables=embedding_bag_configs(task.tables), device=torch.device("meta")
    )
    constraints = table_wise_constraints(task.tables)
    if compute_device not in ("cpu", "cuda"):
        raise ValueError(f"compute_device must be 'cpu' or 'cuda', got {compute_device!r}")
    on_cuda = compute_device == "cuda"
    cap = max(task.memory)
    topology = torchrec_topology(
        task.num_devices, compute_device, hbm_cap=cap if on_cuda else None, ddr_cap=cap
    )
    for dev, cap in zip(topology.devices, task.memory, strict=True):
        if on_cuda:
            dev.storage.hbm = int(cap)
        else:
            dev.storage.ddr = int(cap)
    batch = per_rank_batch(task.batch_size, task.num_devices)
    kwargs = {}
    if accounting == "weights":
        kwargs["enumerator"] = WeightsOnlyEnumerator(
            topology,
            batch_size=batch,
            constraints=constraints,
            sizes={t.name: t.size_bytes for t in task.tables},
        )
    if accounting != "torchrec":
        kwargs["storage_reservation"] = FixedPercentageStorageReservation(0.0)
    with quiet_torchrec():
        planner = EmbeddingShardingPlanner(
            topology=topology,
            batch_size=batch,
            constraints=constraints,
            debug=False,
            **kwargs,
        )
        return plan_ranks(planner.plan(ebc, [EmbeddingBagCollectionSharder()]))
