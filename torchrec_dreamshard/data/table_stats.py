"""Table specs from real data: access statistics of id streams and ``KeyedJaggedTensor``
batches, their bag-length variance, and specs from TorchRec's configs."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from torchrec_dreamshard.data.tables import (
    MAX_BAG_LENGTH_CV,
    NUM_REUSE_BINS,
    TableSpec,
    reuse_bin,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig


def access_stats(
    ids: torch.Tensor | np.ndarray, offsets: torch.Tensor | np.ndarray
) -> tuple[float, tuple[float, ...]]:
    """``(pooling_factor, reuse_hist)`` of one table's batch: flat ``ids`` and ``B + 1``
    bag boundaries ``offsets`` into them (FBGEMM / TorchRec layout)."""
    ids_np = np.asarray(ids.cpu() if isinstance(ids, torch.Tensor) else ids).reshape(-1)
    off_np = np.asarray(offsets.cpu() if isinstance(offsets, torch.Tensor) else offsets)
    off_np = off_np.reshape(-1)
    if off_np.size < 2:
        raise ValueError("offsets must hold at least 2 entries (one bag)")
    if off_np[0] != 0 or off_np[-1] != ids_np.size or np.any(np.diff(off_np) < 0):
        raise ValueError(
            f"offsets must start at 0, be non-decreasing and end at len(ids)={ids_np.size}"
        )
    batch = off_np.size - 1
    if ids_np.size == 0:
        raise ValueError("the batch has no ids: pooling factor would be 0")
    return ids_np.size / batch, hist_from_ids(ids_np)


def hist_from_ids(ids: np.ndarray) -> tuple[float, ...]:
    """Reuse histogram of a flat id array."""
    _, counts = np.unique(np.asarray(ids).reshape(-1), return_counts=True)
    hist = np.bincount(reuse_bin(counts), minlength=NUM_REUSE_BINS).astype(np.float64)
    return tuple((hist / hist.sum()).tolist())


def merge_stats(stats: Sequence[tuple[float, tuple[float, ...], int]]) -> tuple[float, tuple]:
    """Average ``(pooling_factor, reuse_hist, weight)`` over several batches."""
    total = sum(w for _, _, w in stats)
    if total <= 0:
        raise ValueError("no batches to merge")
    pf = sum(p * w for p, _, w in stats) / total
    hist = np.sum([np.asarray(h) * w for _, h, w in stats], axis=0) / total
    return pf, tuple((hist / hist.sum()).tolist())


def group_stats(
    table: str,
    feature_names: Sequence[str],
    batches: Sequence[Mapping[str, Any]],
    batch_size: int,
) -> tuple[float, tuple[float, ...], int] | None:
    """``(pooling_factor, reuse_hist, ids)`` of table ``table`` over the batches
    (``KeyedJaggedTensor.to_dict()`` each, ``batch_size`` samples together), all its
    features' ids counted; ``None`` when they hold none.

    Raises:
        ValueError: a feature is missing from a batch.
    """
    ids = []
    for by_key in batches:
        check_features(table, feature_names, by_key)
        ids += [by_key[f].values() for f in feature_names]
    flat = torch.cat(ids)
    if flat.numel() == 0:
        return None
    return flat.numel() / batch_size, hist_from_ids(flat.cpu().numpy()), flat.numel()


def check_features(table: str, feature_names: Sequence[str], by_key: Mapping[str, Any]) -> None:
    """Raise a ``ValueError`` naming ``table`` where a feature is missing from a batch."""
    missing = [f for f in feature_names if f not in by_key]
    if missing:
        raise ValueError(
            f"table {table!r}: features {missing} are not in the batch (keys: {list(by_key)})"
        )


def group_lengths(
    table: str, feature_names: Sequence[str], batches: Sequence[Mapping[str, Any]]
) -> np.ndarray:
    """Ids per sample of table ``table`` over the batches (``KeyedJaggedTensor.to_dict()``
    each), its features summed.

    Raises:
        ValueError: a feature is missing from a batch, or its features' sample counts differ.
    """
    out = []
    for by_key in batches:
        check_features(table, feature_names, by_key)
        lengths = [by_key[f].lengths().reshape(-1).to(torch.int64) for f in feature_names]
        sizes = sorted({int(x.numel()) for x in lengths})
        if len(sizes) > 1:
            raise ValueError(
                f"table {table!r}: its features {list(feature_names)} hold different numbers "
                f"of samples in one batch ({sizes}): no bag of the table is known"
            )
        out.append(torch.stack(lengths).sum(0).cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


CV_SIGNIFICANCE = 4.0  # standard errors the lengths' excess variance must clear


def gamma_poisson_cv(groups: Sequence[np.ndarray]) -> float | None:
    """The ``bag_length_cv`` of a :class:`TableSpec` whose bags vary as ``groups`` do:
    gamma-Poisson lengths have variance ``m + cv**2 m**2``, groups weighted by samples.

    Returns:
        The cv (at most ``MAX_BAG_LENGTH_CV``), or ``None`` within
        :data:`CV_SIGNIFICANCE` standard errors of 0.

    Raises:
        ValueError: no group holds an id.
    """
    used = [np.asarray(g, dtype=np.float64) for g in groups if np.sum(g) > 0]
    if not used:
        raise ValueError("no sample holds an id: the bags' lengths are unknown")
    total = sum(g.size for g in used)
    excess = var = 0.0
    for g in used:
        mean, weight = float(g.mean()), g.size / total
        excess += weight * (float(g.var()) - mean) / mean**2
        # the sample variance's variance where the lengths are Poisson (m + 2 m^2) / n
        var += weight**2 * (2.0 + 1.0 / mean) / (g.size * mean**2)
    if excess <= CV_SIGNIFICANCE * math.sqrt(var):
        return None
    return min(math.sqrt(excess), MAX_BAG_LENGTH_CV)


def table_configs(model: Any) -> list[tuple[str, Any]]:
    """Every ``(fqn, config)`` of ``model``'s embedding collections, fqn as TorchRec's
    ``ShardingOption.fqn`` (``"<module path>.<table>"``)."""
    return [
        (f"{path}.{c.name}", c)
        for path, child in model.named_modules()
        for c in collection_configs(child)
    ]


def collection_configs(module: Any) -> list[Any]:
    """The table configs of ``module`` if it is an embedding collection, else ``[]``."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    if isinstance(module, EmbeddingBagCollection):
        return list(module.embedding_bag_configs())
    if isinstance(module, EmbeddingCollection):
        return list(module.embedding_configs())
    return []


def spec_from_config(
    config: EmbeddingBagConfig,
    constraints: ParameterConstraints | None = None,
    stats: tuple[float, Sequence[float]] | None = None,
    default_pooling_factor: float = 1.0,
) -> TableSpec:
    """A :class:`TableSpec` from a TorchRec ``EmbeddingBagConfig``; its pooling factor from
    ``stats``, else the constraints' summed ``pooling_factors``, else the default."""
    from torchrec.types import DataType

    hist = None
    if stats is not None:
        pooling, hist = stats[0], tuple(stats[1])
    elif constraints is not None and constraints.pooling_factors:
        pooling = float(sum(constraints.pooling_factors))
    else:
        pooling = default_pooling_factor
    bpe = {DataType.FP32: 4, DataType.FP16: 2}.get(config.data_type)
    if bpe is None:
        raise ValueError(
            f"table {config.name!r}: data_type {config.data_type} is not supported "
            "(use FP32 or FP16)"
        )
    return TableSpec(
        name=config.name,
        rows=config.num_embeddings,
        dim=config.embedding_dim,
        pooling_factor=pooling,
        reuse_hist=hist,
        bytes_per_element=bpe,
    )


def specs_from_kjt_batches(
    configs: Sequence[EmbeddingBagConfig],
    batches: Iterable[Any],
    constraints: Mapping[str, ParameterConstraints] | None = None,
) -> list[TableSpec]:
    """One spec per ``EmbeddingBagConfig``, measured from ``KeyedJaggedTensor`` batches (a
    table fed by several features counts all their ids, as the fused kernel does;
    ``constraints`` by name serve a table with no ids)."""
    per_table: dict[str, list[tuple[float, tuple[float, ...], int]]] = {c.name: [] for c in configs}
    n_batches = 0
    for kjt in batches:
        n_batches += 1
        by_key = kjt.to_dict()
        for config in configs:
            stats = group_stats(config.name, config.feature_names, [by_key], kjt.stride())
            if stats is not None:
                per_table[config.name].append(stats)
    if n_batches == 0:
        raise ValueError("no KeyedJaggedTensor batches were given")
    specs = []
    for config in configs:
        stats = per_table[config.name]
        measured = merge_stats(stats) if stats else None
        cons = (constraints or {}).get(config.name)
        specs.append(spec_from_config(config, cons, measured))
    return specs
