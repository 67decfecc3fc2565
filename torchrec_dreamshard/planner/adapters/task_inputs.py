"""A task file as what TorchRec's planner is given (:func:`task_inputs`): the model, the
topology, the per-rank batch, the constraints and the declared reuse and bag-length cvs,
so that ``dreamshard plan`` plans a task through :class:`DreamShardPlanner` as a training
job plans its model, and a job built from the same task loads that plan.

A task (:mod:`torchrec_dreamshard.data.tasks`) says what TorchRec says another way:

* its tables become one ``EmbeddingBagCollection`` (the model itself, so a table's fully
  qualified name is ``".<name>"``), each table fed by its own feature ``f_<name>``
  (:mod:`torchrec_dreamshard.data.table_configs`), fp16 where ``bytes_per_element`` is 2;
* ``num_devices`` ranks of its ``compute_device`` (``hosts`` of ``local_world_size``
  where given): CPU ranks with each ``memory_bytes`` as TorchRec's DDR capacity, or GPUs
  with it as their HBM (what TorchRec's storage reservation and estimate then take their
  share of); a GPU cluster is planned on any machine, a CPU-only one included;
* ``global_batch_size`` (``Task.batch_size``) becomes TorchRec's per-rank batch
  ``global_batch_size // num_devices`` (it must divide evenly);
* each table's ``pooling_factor`` a ``ParameterConstraints(pooling_factors=[...])``, its
  ``reuse_hist`` the planner's ``reuse_hists``, and its ``bag_length_cv`` (bursty bags,
  which TorchRec has no field for) the planner's ``bag_length_cvs``: the cost network does
  not see the cv, but the kernels the planner calibrates on and verifies with are fed bags
  that vary as the task's do;
* a table that fits no device whole (its weights over :data:`WHOLE_SHARE` of the largest
  device's memory: TorchRec's default storage reservation keeps 15%) may be split into
  column-wise shards down to :data:`~torchrec_dreamshard.data.splits.SHARD_COLUMN_MULTIPLE`
  columns (``min_partition``), as a task file means: a table bigger than every device is
  split. Every other table keeps TorchRec's narrowest column-wise shard (``MIN_CW_DIM``,
  128 columns).
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
        topology: the task's ranks (CPU or GPU, hosts of ``local_world_size``) with its
            memory.
        batch_size: TorchRec's per-rank batch.
        constraints: each table's pooling factor, by table name.
        reuse_hists: the declared reuse histograms, by fully qualified name.
        bag_length_cvs: the declared bag-length cvs, by fully qualified name (tables of
            bursty bags only).
    """

    model: EmbeddingBagCollection
    topology: Topology
    batch_size: int
    constraints: dict[str, ParameterConstraints]
    reuse_hists: dict[str, tuple[float, ...]]
    bag_length_cvs: dict[str, float] = field(default_factory=dict)

    def planner_arguments(self) -> dict[str, Any]:
        """The ``DreamShardPlanner`` arguments they are: ``topology``, ``batch_size``,
        ``constraints``, ``reuse_hists`` and ``bag_length_cvs``."""
        return {
            "topology": self.topology,
            "batch_size": self.batch_size,
            "constraints": self.constraints,
            "reuse_hists": self.reuse_hists,
            "bag_length_cvs": self.bag_length_cvs,
        }


def per_rank_batch(task: Task) -> int:
    """TorchRec's per-rank batch of ``task``: its global batch over its devices
    (:func:`torchrec_dreamshard.data.task_fields.per_rank_batch`, the one rule).

    Raises:
        ValueError: the global batch does not divide evenly among the devices.
    """
    return split_batch(task.batch_size, task.num_devices)


def task_topology(task: Task) -> Topology:
    """TorchRec's ``Topology`` of ``task``'s devices: ``num_devices`` ranks of its
    ``compute_device`` in hosts of its ``local_world_size``, each device's memory its DDR
    (``"cpu"``) or its HBM (``"cuda"``)."""
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
    """The task's tables as one ``EmbeddingBagCollection`` on ``device`` (``"meta"`` to
    plan; ``"meta"`` too for ``DistributedModelParallel``, which builds the shards)."""
    configs = [
        dataclasses.replace(c, data_type=DataType.FP16) if t.bytes_per_element == 2 else c
        for t, c in zip(task.tables, embedding_bag_configs(task.tables), strict=True)
    ]
    return EmbeddingBagCollection(tables=configs, device=torch.device(device))


def task_inputs(task: Task, device: str | torch.device = "meta") -> TaskInputs:
    """What TorchRec's planner is given for ``task`` (see the module docstring), the model
    on ``device``.

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
