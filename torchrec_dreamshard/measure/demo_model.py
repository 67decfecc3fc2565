"""The demo's DLRM-style model and its ``KeyedJaggedTensor`` batches, built from table
specs (used by ``dreamshard demo``, the step-time model and the tests), the
``EmbeddingBagConfig`` of each table with the feature that feeds it in every model we
build, and the way we build the TorchRec ``Topology`` a model is planned on
(:func:`torchrec_topology`, re-exported by the planner's adapter). Public TorchRec API
only: TorchRec's internals are read by the planner's adapter.

The model concatenates the pooled embeddings with the dense arch's output (torchrec's
``DLRM`` needs one embedding dim for every table; the pool's tables have dims 4 to 256).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torchrec.distributed.planner.types import (
    KernelConfig,
    Topology,
    TopologyFactory,
    TrainerConfig,
)
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.workloads import generate_batch

DENSE_IN = 13  # dense features, as in Criteo


def feature_name(table: TableSpec) -> str:
    """The feature that feeds ``table`` in the models we build: ``f_<table name>``."""
    return f"f_{table.name}"


def embedding_bag_configs(
    tables: Sequence[TableSpec], feature: Callable[[TableSpec], str] = feature_name
) -> list[EmbeddingBagConfig]:
    """One ``EmbeddingBagConfig`` per table, fed by the feature ``feature(table)``."""
    return [
        EmbeddingBagConfig(
            name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[feature(t)]
        )
        for t in tables
    ]


def torchrec_topology(
    world_size: int,
    compute_device: str,
    *,
    local_world_size: int | None = None,
    hbm_cap: int | None = None,
    ddr_cap: int | None = None,
) -> Topology:
    """A TorchRec ``Topology`` built the way TorchRec 1.8 asks, through
    ``TopologyFactory.create_topology`` (a ``Topology`` constructed directly logs that
    "the job will fail"). It is the topology ``Topology(...)`` builds from the same
    arguments: TorchRec's default bandwidths and multipliers, and every device with
    ``hbm_cap`` / ``ddr_cap`` bytes (TorchRec's defaults when ``None``).

    Args:
        world_size: ranks.
        compute_device: ``"cpu"``, ``"cuda"`` or ``"mtia"``.
        local_world_size: ranks per host (``None``: all of them).
        hbm_cap: HBM bytes of each device (ignored on ``"cpu"``, as by ``Topology``).
        ddr_cap: DDR bytes of each device.
    """
    return TopologyFactory.create_topology(
        trainer_config=TrainerConfig(
            world_size=world_size,
            local_world_size=local_world_size,
            hbm_cap_bytes=hbm_cap,
            ddr_cap_bytes=ddr_cap,
        ),
        kernel_config=KernelConfig(compute_device=compute_device),
    )


class DemoDLRM(nn.Module):
    """Dense MLP, pooled embeddings of every table (``sparse``), over MLP.

    Args:
        tables: the tables, each fed by the feature ``f_<table name>``.
        device: where the embedding tables live (``meta`` for planning).
    """

    def __init__(self, tables: Sequence[TableSpec], device: torch.device) -> None:
        super().__init__()
        self.sparse = EmbeddingBagCollection(tables=embedding_bag_configs(tables), device=device)
        self.dense = nn.Sequential(nn.Linear(DENSE_IN, 32), nn.ReLU())
        width = 32 + sum(t.dim for t in tables)
        self.over = nn.Sequential(nn.Linear(width, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.sparse(sparse).values()
        return self.over(torch.cat([self.dense(dense), pooled], dim=1)).squeeze(-1)


def sample_kjt(tables: Sequence[TableSpec], batch: int, seed: int) -> KeyedJaggedTensor:
    """A batch with every table's ids drawn to its statistics (pooling, reuse)."""
    values, lengths = [], []
    for i, t in enumerate(tables):
        ids, offsets = generate_batch(t, batch, seed=seed * 100_003 + i)
        values.append(ids)
        lengths.append(offsets[1:] - offsets[:-1])
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[feature_name(t) for t in tables],
        values=torch.cat(values),
        lengths=torch.cat(lengths).to(torch.int32),
    )
