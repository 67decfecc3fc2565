"""The package's one DLRM-like TorchRec model (:class:`StepDLRM`), built from table
specs, with its batches: what the step timer trains, ``dreamshard demo`` plans and trains,
and the tests plan. Public TorchRec API only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor
from torchrec.streamable import Pipelineable

from torchrec_dreamshard.data.table_configs import (
    embedding_bag_configs,
    embedding_configs,
    feature_name,
)
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.task_fields import CLUSTER_KEYS as TASK_CLUSTER_KEYS
from torchrec_dreamshard.data.workloads import generate_batch

DENSE_IN = 13  # dense features, as in Criteo
DENSE_WIDTH = 32  # outputs of the dense MLP
OVER_WIDTH = 64  # hidden units of the over-arch


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


@dataclass(frozen=True, kw_only=True)
class StepModelSpec:
    """The tables of the model (:class:`StepDLRM`), each fed by ``f_<name>``.

    Attributes:
        bags: pooled tables (an ``EmbeddingBagCollection``).
        sequences: sequence tables (an ``EmbeddingCollection``; one dim for all).
        constraints: ``ParameterConstraints`` by table name handed to planners (``None``:
            each table's pooling factor).
    """

    bags: tuple[TableSpec, ...] = ()
    sequences: tuple[TableSpec, ...] = ()
    constraints: Mapping[str, ParameterConstraints] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bags", tuple(self.bags))
        object.__setattr__(self, "sequences", tuple(self.sequences))
        if not self.bags and not self.sequences:
            raise ValueError("a step model needs at least one bag or sequence table")
        names = [t.name for t in self.tables]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"table names must be unique across bags and sequences: {dupes}")
        dims = sorted({t.dim for t in self.sequences})
        if len(dims) > 1:
            raise ValueError(
                f"sequence tables must share one dim (TorchRec's EmbeddingCollection), got {dims}"
            )
        unknown = sorted(set(self.constraints or {}) - set(names))
        if unknown:
            raise ValueError(f"constraints name tables the model does not have: {unknown}")

    @property
    def tables(self) -> tuple[TableSpec, ...]:
        return self.bags + self.sequences

    def planner_constraints(self) -> dict[str, ParameterConstraints]:
        """The constraints planners get: the given ones, else each table's pooling factor."""
        if self.constraints is not None:
            return dict(self.constraints)
        return {
            t.name: ParameterConstraints(pooling_factors=[t.pooling_factor]) for t in self.tables
        }

    def to_dict(self) -> dict[str, Any]:
        """The tables as JSON (constraints are not written)."""
        return {
            "tables": [t.to_dict() for t in self.bags],
            "sequence_tables": [t.to_dict() for t in self.sequences],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepModelSpec:
        """From ``{"tables": [...], "sequence_tables": [...]}``; a task file's other fields
        are accepted and ignored."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a model spec must be a JSON object, got {type(data).__name__}")
        task_fields = {"num_devices", "memory_bytes", "global_batch_size", "batch_size"}
        known = {"tables", "sequence_tables", *task_fields, *TASK_CLUSTER_KEYS}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"model spec has unknown fields {unknown}; known: {sorted(known)}")
        lists = {}
        for key in ("tables", "sequence_tables"):
            value = data.get(key, [])
            if not isinstance(value, list):
                raise ValueError(f"model spec field {key!r} must be a list of table objects")
            lists[key] = tuple(TableSpec.from_dict(t) for t in value)
        return cls(bags=lists["tables"], sequences=lists["sequence_tables"])


def spec_from_configs(
    bag_configs: Sequence[Any] = (),
    sequence_configs: Sequence[Any] = (),
    constraints: Mapping[str, ParameterConstraints] | None = None,
) -> StepModelSpec:
    """A :class:`StepModelSpec` from ``EmbeddingBagConfig``s (bags) and ``EmbeddingConfig``s
    (sequences), pooling from the constraints' ``pooling_factors`` (1.0 without), uniform
    reuse (measured: :func:`~torchrec_dreamshard.data.table_stats.specs_from_kjt_batches`)."""
    from torchrec_dreamshard.data.table_stats import spec_from_config

    def specs(configs: Sequence[Any]) -> tuple[TableSpec, ...]:
        return tuple(spec_from_config(c, (constraints or {}).get(c.name)) for c in configs)

    return StepModelSpec(
        bags=specs(bag_configs), sequences=specs(sequence_configs), constraints=constraints
    )


@dataclass
class StepBatch(Pipelineable):
    """One local batch: dense features, the bag and sequence tables' ids, labels."""

    dense: torch.Tensor
    bag_features: KeyedJaggedTensor | None
    sequence_features: KeyedJaggedTensor | None
    labels: torch.Tensor

    def _map(self, fn) -> StepBatch:
        kjts = (self.bag_features, self.sequence_features)
        bags, seqs = (None if k is None else fn(k) for k in kjts)
        return StepBatch(
            dense=fn(self.dense), bag_features=bags, sequence_features=seqs, labels=fn(self.labels)
        )

    def to(self, device: torch.device, non_blocking: bool = False) -> StepBatch:
        return self._map(lambda x: x.to(device=device, non_blocking=non_blocking))

    def record_stream(self, stream: Any) -> None:
        for x in (self.dense, self.bag_features, self.sequence_features, self.labels):
            if x is not None:
                x.record_stream(stream)

    def pin_memory(self) -> StepBatch:
        return self._map(lambda x: x.pin_memory())


def make_batch(spec: StepModelSpec, batch_size: int, seed: int) -> StepBatch:
    """A batch of ``batch_size`` samples, deterministic in ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return StepBatch(
        dense=torch.randn(batch_size, DENSE_IN, generator=g),
        bag_features=sample_kjt(spec.bags, batch_size, seed) if spec.bags else None,
        sequence_features=(
            sample_kjt(spec.sequences, batch_size, seed + 7919) if spec.sequences else None
        ),
        labels=torch.randint(0, 2, (batch_size,), generator=g).float(),
    )


def _sum_ids(jt: JaggedTensor) -> torch.Tensor:
    """A sequence feature's embeddings summed over each sample's ids (0 for none)."""
    return torch.segment_reduce(jt.values(), "sum", lengths=jt.lengths(), axis=0, unsafe=True)


class StepDLRM(nn.Module):
    """A dense MLP over 13 features and the pooled bag tables and id-summed sequence tables,
    concatenated into an over-arch with one logit (binary cross-entropy).

    The embeddings are concatenated, not TorchRec's ``DLRM`` interaction, which needs one
    dim for all tables. Embeddings live on ``table_device`` (``meta`` for planning and
    DMP), the dense part on the CPU; ``forward(batch)`` returns ``(loss, logits)``.
    """

    def __init__(self, spec: StepModelSpec, table_device: torch.device) -> None:
        super().__init__()
        self.sparse = (
            EmbeddingBagCollection(tables=embedding_bag_configs(spec.bags), device=table_device)
            if spec.bags
            else None
        )
        self.sequences = (
            EmbeddingCollection(tables=embedding_configs(spec.sequences), device=table_device)
            if spec.sequences
            else None
        )
        self.sequence_features = [feature_name(t) for t in spec.sequences]
        self.dense = nn.Sequential(nn.Linear(DENSE_IN, DENSE_WIDTH), nn.ReLU())
        width = DENSE_WIDTH + sum(t.dim for t in spec.tables)
        self.over = nn.Sequential(nn.Linear(width, OVER_WIDTH), nn.ReLU(), nn.Linear(OVER_WIDTH, 1))

    def forward(self, batch: StepBatch) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [self.dense(batch.dense)]
        if self.sparse is not None:
            parts.append(self.sparse(batch.bag_features).values())
        if self.sequences is not None:
            out = self.sequences(batch.sequence_features)
            parts.extend(_sum_ids(out[name]) for name in self.sequence_features)
        logits = self.over(torch.cat(parts, dim=1)).squeeze(-1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, logits.detach()
