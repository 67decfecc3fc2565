"""Where our table specs become TorchRec objects and TorchRec's planner is read (its
internals through :mod:`torchrec_dreamshard.torchrec_compat`)."""

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
    """Table-wise fused constraints, with each table's pooling factor."""
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
    """TorchRec's default ``HeuristicalStorageReservation(percentage)``, its dense estimate
    filled for ``model`` (``None``: later) and ``sharders``."""
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
    dense part anyway (6 x its parameters plus buffers), which silences TorchRec's dry-run
    warning without changing the reservation."""
    # 6.0: HeuristicalStorageReservation's parameter_multiplier (parameter, optimizer, DDP)
    estimate = dense_tensor_estimate(model, list(sharders), multiplier=6.0)
    set_dense_tensor_estimate(reservation, estimate)  # TorchRec's constructor argument


def reserved_topology(reservation: StorageReservation | None, topology: Topology) -> Topology:
    """The topology left after the storage reservation's last reservation (else ``topology``)."""
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
    """TorchRec's enumerator with each shard's storage set to its table's ``sizes``."""

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
    """TorchRec's ``EmbeddingShardingPlanner`` on ``task``, table-wise fused only; the rank of
    every table it placed.

    Args:
        task: the task (its batch is the global batch).
        accounting: ``"torchrec"`` (TorchRec's storage estimate and 15% reservation),
            ``"unreserved"`` (its estimate, nothing reserved) or ``"weights"`` (a table
            costs its weights' bytes, nothing reserved).
        compute_device: ``"cpu"`` (memory is DDR) or ``"cuda"`` (HBM; no GPU needed).

    Raises:
        PlannerError: TorchRec's planner found no plan.
        ValueError: an unknown ``accounting``, or a batch that does not divide evenly.
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
