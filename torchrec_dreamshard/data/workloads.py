"""Deterministic batches of ids whose statistics match a :class:`TableSpec`: ``round(B p)``
ids over distinct rows whose access counts follow the reuse histogram, shuffled and dealt
to samples (multinomial lengths, or gamma-Poisson with ``bag_length_cv``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from torchrec_dreamshard.data.tables import BIN_HIGH, BIN_LOW, BIN_MID, NUM_REUSE_BINS, TableSpec

# The tests' tolerances: the pooling factor always, the histogram's L1 distance on big tables.
POOLING_TOLERANCE = 0.01  # relative
HIST_L1_TOLERANCE = 0.05


def _draw_counts(hist: np.ndarray, total: int, rows: int, rng: np.random.Generator) -> np.ndarray:
    """Access counts of distinct rows, drawn by ``hist``, summing to exactly ``total``."""
    mean_count = float(np.sum(hist * BIN_MID))
    guess = int(min(rows, max(1, 1.2 * total / max(mean_count, 1.0) + 64)))
    counts = np.empty(0, dtype=np.int64)
    while True:
        bins = rng.choice(NUM_REUSE_BINS, size=guess, p=hist)
        drawn = rng.integers(BIN_LOW[bins], BIN_HIGH[bins] + 1)
        counts = np.concatenate([counts, drawn])[:rows]
        cum = np.cumsum(counts)
        if cum[-1] >= total:
            n = int(np.searchsorted(cum, total)) + 1  # rows needed to reach total
            counts = counts[:n].copy()
            counts[-1] -= int(cum[n - 1] - total)
            return counts
        if counts.size >= rows:  # every row used: scale up to reach total
            scaled = np.floor(counts * (total / cum[-1])).astype(np.int64)
            scaled = np.maximum(scaled, 1)
            short = total - int(scaled.sum())
            if short > 0:
                np.add.at(scaled, rng.integers(0, scaled.size, short), 1)
            elif short < 0:
                scaled = _trim(scaled, -short)
            return scaled


def _trim(counts: np.ndarray, excess: int) -> np.ndarray:
    """Remove ``excess`` accesses from the largest counts, keeping every count >= 1."""
    order = np.argsort(-counts)
    for i in order:
        take = min(excess, int(counts[i]) - 1)
        counts[i] -= take
        excess -= take
        if excess == 0:
            break
    return counts


def generate_batch(
    spec: TableSpec, batch_size: int, seed: int | np.random.Generator = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of ids for ``spec``, deterministic in ``seed`` (an int or a ``Generator``):
    ``(ids, offsets)``, int64, ``ids`` flat and ``batch_size + 1`` offsets."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    total = max(1, int(round(batch_size * spec.pooling_factor)))
    counts = _draw_counts(spec.hist(batch_size), total, spec.rows, rng)
    rows = _distinct_rows(spec.rows, counts.size, rng)
    ids = np.repeat(rows, counts)
    rng.shuffle(ids)
    lengths = _bag_lengths(total, batch_size, spec.bag_length_cv, rng)
    offsets = np.zeros(batch_size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(offsets)


def _bag_lengths(
    total: int, batch_size: int, cv: float | None, rng: np.random.Generator
) -> np.ndarray:
    """Ids per sample summing to ``total``: multinomial, or gamma shares of cv ``cv``."""
    if cv is None or cv == 0:
        return np.bincount(rng.integers(0, batch_size, total), minlength=batch_size)
    shares = rng.gamma(1.0 / cv**2, 1.0, batch_size)
    return rng.multinomial(total, shares / shares.sum())


def _distinct_rows(rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    if n > rows:
        raise AssertionError("more distinct rows than the table has")
    if n * 4 >= rows:
        return rng.permutation(rows)[:n]
    # Sparse case: draw with replacement, then top up until n distinct rows.
    picked = np.unique(rng.integers(0, rows, int(n * 1.1) + 8))
    while picked.size < n:
        picked = np.unique(np.concatenate([picked, rng.integers(0, rows, n)]))
    return rng.permutation(picked)[:n]


def generate_fused_batch(
    specs: Sequence[TableSpec], batch_size: int, seed: int | np.random.Generator = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch for a fused (table-batched) kernel over ``specs``, ``(indices, offsets)`` in
    FBGEMM's table-major layout (see :func:`fuse_batches`)."""
    if not specs:
        raise ValueError("a fused batch needs at least one table")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return fuse_batches([generate_batch(spec, batch_size, rng) for spec in specs])


def fuse_batches(
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-table ``(ids, offsets)`` laid out table-major, as FBGEMM's fused kernel takes them."""
    all_ids, all_offsets, base = [], [torch.zeros(1, dtype=torch.int64)], 0
    for ids, offsets in batches:
        all_ids.append(ids)
        all_offsets.append(offsets[1:] + base)
        base += ids.numel()
    return torch.cat(all_ids), torch.cat(all_offsets)
