"""A task file as TorchRec's planner inputs (:func:`task_inputs`), so that ``dreamshard plan``
plans a task as a training job plans its model.

The tables become one ``EmbeddingBagCollection`` (fqn ``".<name>"``, feature ``f_<name>``);
``num_devices`` ranks of ``compute_device`` with ``memory_bytes`` as DDR (CPU) or HBM (GPU);
the per-rank batch ``global_batch_size // num_devices``; pooling factors as constraints,
reuse histograms and bag-length cvs as the planner's arguments. A table over
:data:`WHOLE_SHARE` of the largest device may split column-wise down to
:data:`~torchrec_dreamshard.data.splits.SHARD_COLUMN_MULTIPLE` columns.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.modules.embedding_configs import DataType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from torchrec_dreamshard.data.splits import SHARD_COLUMN_MULTIPLE
from torchrec_dreamshard.data.table_configs import embedding_bag_configs
from torchrec_dreamshard.data.task_fields import per_rank_batch as split_batch
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.planner.adapters.topology import torchrec_topology

MODULE_PATH = ""  # the collection is the model itself
WHOLE_SHARE = 0.85  # of a device's memory, what a table's weights may take and fit whole


def table_fqn(name: str) -> str:
    """The fully qualified name of task table ``name`` in :func:`task_model`'s model."""
    return f"{MODULE_PATH}.{name}"


@dataclass(frozen=True)
class TaskInputs:
    """What a planner is given for a task (:func:`task_inputs`).

    Attributes:
        model: the tables' ``EmbeddingBagCollection``.
        topology: the task's ranks with its memory.
        batch_size: TorchRec's per-rank batch.
        constraints: each table's pooling factor, by table name.
        reuse_hists: the declared reuse histograms, by fqn.
        bag_length_cvs: the declared bag-length cvs, by fqn.
    """

    model: EmbeddingBagCollection
    topology: Topology
    batch_size: int
    constraints: dict[str, ParameterConstraints]
    reuse_hists: dict[str, tuple[float, ...]]
    bag_length_cvs: dict[str, float] = field(default_factory=dict)

    def planner_arguments(self) -> dict[str, Any]:
        """The ``DreamShardPlanner`` keyword arguments they are."""
        return {
            "topology": self.topology,
            "batch_size": self.batch_size,
            "constraints": self.constraints,
            "reuse_hists": self.reuse_hists,
            "bag_length_cvs": self.bag_length_cvs,
        }


def per_rank_batch(task: Task) -> int:
    """TorchRec's per-rank batch of ``task``.

    Raises:
        ValueError: the global batch does not divide evenly among the devices.
    """
    return split_batch(task.batch_size, task.num_devices)


def task_topology(task: Task) -> Topology:
    """TorchRec's ``Topology`` of ``task``'s devices, each device's memory its DDR or HBM."""
    caps = [int(m) for m in task.memory]
    on_cuda = task.compute_device == "cuda"
    return torchrec_topology(
        task.num_devices,
        task.compute_device,
        local_world_size=task.local_world_size,
        hbm_caps=caps if on_cuda else None,
        ddr_caps=None if on_cuda else caps,
    )


def task_model(task: Task, device: str | torch.device = "meta") -> EmbeddingBagCollection:
    """The task's tables as one ``EmbeddingBagCollection`` on ``device`` (``"meta"`` to plan)."""
    configs = [
        dataclasses.replace(c, data_type=DataType.FP16) if t.bytes_per_element == 2 else c
        for t, c in zip(task.tables, embedding_bag_configs(task.tables), strict=True)
    ]
    return EmbeddingBagCollection(tables=configs, device=torch.device(device))


def task_inputs(task: Task, device: str | torch.device = "meta") -> TaskInputs:
    """What TorchRec's planner is given for ``task``, the model on ``device``.

    Raises:
        ValueError: the global batch does not divide evenly among the devices.
    """
    batch = per_rank_batch(task)
    topology = task_topology(task)
    whole = WHOLE_SHARE * max(task.memory)
    constraints = {
        t.name: ParameterConstraints(
            pooling_factors=[float(t.pooling_factor)],
            min_partition=SHARD_COLUMN_MULTIPLE if t.size_bytes > whole else None,
        )
        for t in task.tables
    }
    reuse = {table_fqn(t.name): tuple(t.reuse_hist) for t in task.tables if t.reuse_hist}
    cvs = {table_fqn(t.name): t.bag_length_cv for t in task.tables if t.bag_length_cv is not None}
    return TaskInputs(task_model(task, device), topology, batch, constraints, reuse, cvs)
