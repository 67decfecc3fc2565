"""A table's TorchRec configuration (``EmbeddingBagConfig`` pooled, ``EmbeddingConfig``
sequence) of a :class:`~torchrec_dreamshard.data.tables.TableSpec`, fed by ``f_<table name>``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig

from torchrec_dreamshard.data.tables import TableSpec


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


def embedding_configs(tables: Sequence[TableSpec]) -> list[EmbeddingConfig]:
    """One ``EmbeddingConfig`` (a sequence table) per table, fed by ``f_<name>``."""
    return [
        EmbeddingConfig(
            name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[feature_name(t)]
        )
        for t in tables
    ]
