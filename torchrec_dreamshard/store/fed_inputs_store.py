"""What running jobs fed their tables (ids per sample per feature, reuse histograms), kept in
the store's ``observed_inputs`` table by each table's place, shape and features."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from torch import nn

from torchrec_dreamshard.data.table_stats import table_configs
from torchrec_dreamshard.store.cost_store import CostStore

_SCHEMA = """
CREATE TABLE IF NOT EXISTS observed_inputs (
    table_key TEXT PRIMARY KEY,
    updated_at REAL NOT NULL,
    pooling TEXT NOT NULL,
    reuse TEXT
);
"""


def table_keys(model: nn.Module) -> dict[str, str]:
    """The key of each table of ``model`` by fqn: its place, shape and features."""
    return {
        fqn: json.dumps([fqn, c.num_embeddings, c.embedding_dim, list(c.feature_names)])
        for fqn, c in table_configs(model)
    }


def remember_inputs(
    store_path: Path,
    model: nn.Module,
    fed: Mapping[str, Sequence[float]],
    reuse: Mapping[str, Sequence[float]],
) -> int:
    """Keep what a job fed ``model``'s tables (``fed``: ids per sample per feature; ``reuse``:
    histograms), replacing older; returns how many were kept."""
    keys = table_keys(model)
    unknown = sorted(set(fed) - set(keys))
    if unknown:
        raise ValueError(f"tables {unknown} are not tables of the model ({sorted(keys)})")
    store_path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        (
            keys[fqn],
            time.time(),
            json.dumps([float(p) for p in pooling]),
            None if reuse.get(fqn) is None else json.dumps([float(x) for x in reuse[fqn]]),
        )
        for fqn, pooling in fed.items()
    ]
    with CostStore(store_path) as store:
        store.add_table(_SCHEMA)
        store.write_rows(
            "INSERT OR REPLACE INTO observed_inputs (table_key, updated_at, pooling, reuse) "
            "VALUES (?,?,?,?)",
            rows,
        )
    return len(rows)


def recalled_inputs(
    store_path: Path, model: nn.Module
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """The kept pooling factors and reuse histograms of ``model``'s tables, by fqn."""
    if not store_path.exists():
        return {}, {}
    keys = table_keys(model)
    found: dict[str, tuple[list[float], list[float] | None]] = {}
    values = list(keys.values())
    with CostStore(store_path) as store:
        if not store.has_table("observed_inputs"):
            return {}, {}
        for i in range(0, len(values), 500):  # SQLite's limit on bound parameters
            chunk = values[i : i + 500]
            rows = store.read_rows(
                "SELECT table_key, pooling, reuse FROM observed_inputs "
                f"WHERE table_key IN ({','.join('?' * len(chunk))})",
                chunk,
            )
            for key, pooling, reuse in rows:
                found[key] = (json.loads(pooling), None if reuse is None else json.loads(reuse))
    pooling_by_fqn, reuse_by_fqn = {}, {}
    for fqn, key in keys.items():
        if key in found:
            pooling_by_fqn[fqn] = sum(found[key][0])
            if found[key][1] is not None:
                reuse_by_fqn[fqn] = found[key][1]
    return pooling_by_fqn, reuse_by_fqn


def count_inputs(store_path: Path) -> int:
    """How many tables' fed inputs the store at ``store_path`` keeps (0 without one)."""
    if not store_path.exists():
        return 0
    with CostStore(store_path) as store:
        if not store.has_table("observed_inputs"):
            return 0
        return int(store.read_rows("SELECT COUNT(*) FROM observed_inputs")[0][0])


def forget_inputs(store_path: Path) -> int:
    """Forget every table's fed inputs (measurements stay); returns how many."""
    count = count_inputs(store_path)
    if count:
        with CostStore(store_path) as store:
            store.write_rows("DELETE FROM observed_inputs", [()])
    return count
