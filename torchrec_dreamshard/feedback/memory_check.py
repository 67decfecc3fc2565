"""The memory check before the job: each rank's FBGEMM kernels of a ``ShardingPlan`` built on
the CPU in turn, their state read off the tensors and one step run for the buffers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from torchrec_dreamshard.feedback.rank_memory import BUFFERS

DATA_PARALLEL = "data_parallel"


def table_configs(model: nn.Module) -> dict[str, tuple[str, Any]]:
    """``module.table`` -> ``(module path, EmbeddingBagConfig)`` of ``model``'s tables."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    out = {}
    for path, module in model.named_modules():
        if isinstance(module, EmbeddingBagCollection):
            for config in module.embedding_bag_configs():
                out[f"{path}.{config.name}"] = (path, config)
    return out


def optimizer_of(model: nn.Module, fused_params: Mapping[str, Any] | None) -> Any:
    """The job's FBGEMM optimizer: ``fused_params["optimizer"]``, else the one
    ``_apply_optimizer_in_backward`` gave the tables, else SGD."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.utils import optimizer_type_to_emb_opt_type

    if fused_params and fused_params.get("optimizer") is not None:
        return fused_params["optimizer"]
    for module in model.modules():
        for p in module.parameters(recurse=False):
            classes = getattr(p, "_optimizer_classes", None)
            if classes:
                return optimizer_type_to_emb_opt_type(classes[0])
    return EmbOptimType.EXACT_SGD


def rank_shards(plan: Any, world: int) -> list[list[tuple[str, list[int], str]]]:
    """Per rank, ``(module.table, [rows, cols], sharding type)`` of every shard it holds."""
    out: list[list[tuple[str, list[int], str]]] = [[] for _ in range(world)]
    for path, module_plan in plan.plan.items():
        for name, ps in module_plan.items():
            fqn = f"{path}.{name}"
            if ps.sharding_type == DATA_PARALLEL or ps.sharding_spec is None:
                for rank in ps.ranks or range(world):
                    out[rank].append((fqn, [], ps.sharding_type))
                continue
            for shard in ps.sharding_spec.shards:
                rank = shard.placement.rank()
                out[rank].append((fqn, list(shard.shard_sizes), ps.sharding_type))
    return out


def _batch(batch: int, pooling: float, gen: torch.Generator, rows: int) -> Any:
    lengths = torch.poisson(torch.full((batch,), float(pooling)), generator=gen).long()
    return lengths, torch.randint(0, max(rows, 1), (int(lengths.sum()),), generator=gen)


def _kernel(specs: list[tuple[int, int]], optimizer: Any, dense: bool) -> nn.Module:
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        DenseTableBatchedEmbeddingBagsCodegen,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    if dense:
        return DenseTableBatchedEmbeddingBagsCodegen(specs, use_cpu=True)
    return SplitTableBatchedEmbeddingBagsCodegen(
        [(r, d, EmbeddingLocation.HOST, ComputeDevice.CPU) for r, d in specs],
        optimizer=optimizer,
    )


def _state(module: nn.Module, names: list[str]) -> dict[str, dict[str, int]]:
    from types import SimpleNamespace

    from torchrec_dreamshard.feedback.rank_memory import kernel_state_bytes

    tables = [SimpleNamespace(name=n) for n in names]
    kernel = SimpleNamespace(emb_module=module, config=SimpleNamespace(embedding_tables=tables))
    return kernel_state_bytes(kernel)  # type: ignore[arg-type]


def check_rank(
    shards: list[tuple[str, list[int], str]],
    configs: Mapping[str, tuple[str, Any]],
    batch: int,
    world: int,
    optimizer: Any,
    pooling: Mapping[str, float],
) -> dict[str, dict[str, int]]:
    """One rank's tables: weights, optimizer state and per-step buffers of its ``shards``."""
    out: dict[str, dict[str, int]] = {}
    gen = torch.Generator().manual_seed(0)
    for dense in (False, True):
        mine = [s for s in shards if (s[2] == DATA_PARALLEL) is dense]
        if not mine:
            continue
        specs = []
        for fqn, size, _ in mine:
            config = configs[fqn][1]
            specs.append(
                (size[0], size[1]) if size else (config.num_embeddings, config.embedding_dim)
            )
        names = [f"{fqn}#{i}" for i, (fqn, _, _) in enumerate(mine)]
        module = _kernel(specs, optimizer, dense)
        state = _state(module, names)
        rows_in = batch if dense else batch * world  # a sharded kernel sees every rank's batch
        lengths, values = [], []
        for (fqn, _, _), (rows, _) in zip(mine, specs, strict=True):
            features = len(configs[fqn][1].feature_names)
            for _ in range(features):
                n, v = _batch(rows_in, pooling.get(fqn, 1.0) / features, gen, rows)
                lengths.append(n)
                values.append(v)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cat(lengths).cumsum(0)])
        pooled = module(torch.cat(values), offsets)
        pooled.sum().backward()
        start = 0
        for i, (fqn, _, _) in enumerate(mine):
            features = len(configs[fqn][1].feature_names)
            ids = sum(int(n.sum()) for n in lengths[start : start + features])
            width = specs[i][1] * features
            parts = out.setdefault(fqn, {"weights": 0, "optimizer": 0, **dict.fromkeys(BUFFERS, 0)})
            parts["weights"] += state[names[i]]["weights"]
            parts["optimizer"] += state[names[i]]["optimizer"]
            parts["inputs"] += ids * 8 + 2 * features * rows_in * 8
            parts["outputs"] += rows_in * width * pooled.element_size()
            parts["grads"] += rows_in * width * pooled.element_size()
            start += features
        del module, pooled
    return out


def check_plan(
    plan: Any,
    model: nn.Module,
    batch_size: int,
    world_size: int,
    fused_params: Mapping[str, Any] | None = None,
    pooling: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """What each rank of ``plan`` will allocate, per rank ``{"rank", "tables": {module.table:
    {weights, optimizer, inputs, outputs, grads}}, "total"}``.

    Args:
        model: the model (its tables may be on the meta device).
        batch_size: the per-rank batch.
        fused_params: the sharder's ``fused_params`` (its ``optimizer``), if any.
        pooling: ids per sample of each table (``module.table``; default 1).
    """
    if batch_size < 1 or world_size < 1:
        raise ValueError(f"batch_size and world_size must be >= 1, got {batch_size}, {world_size}")
    configs = table_configs(model)
    unknown = sorted({f for r in rank_shards(plan, world_size) for f, _, _ in r} - set(configs))
    if unknown:
        raise ValueError(f"the plan shards tables the model does not have: {unknown}")
    optimizer = optimizer_of(model, fused_params)
    out = []
    for rank, shards in enumerate(rank_shards(plan, world_size)):
        tables = check_rank(shards, configs, batch_size, world_size, optimizer, pooling or {})
        total = sum(sum(parts.values()) for parts in tables.values())
        out.append({"rank": rank, "tables": tables, "total": total})
    return out


def check_lines(ranks: list[dict[str, Any]], caps: list[int] | None = None) -> list[str]:
    """The check as a table (MB per rank; ``caps``: each device's capacity)."""
    lines = ["rank  tables  weights  optimizer  buffers    total     cap"]
    for r in ranks:
        t = r["tables"].values()
        weights = sum(p["weights"] for p in t) / 2**20
        optimizer = sum(p["optimizer"] for p in t) / 2**20
        buffers = sum(sum(p[k] for k in BUFFERS) for p in t) / 2**20
        cap = f"{caps[r['rank']] / 2**20:.2f}" if caps else "-"
        lines.append(
            f"{r['rank']:>4}  {len(r['tables']):>6}  {weights:>7.2f}  {optimizer:>9.2f}  "
            f"{buffers:>7.2f}  {r['total'] / 2**20:>7.2f}  {cap:>6}"
        )
    return lines
