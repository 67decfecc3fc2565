"""The refinement's neighbourhood: moves and swaps off the bottleneck device within memory,
and their device states as one batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

REFINE_CANDIDATES = 256  # moves/swaps rated per refinement step, at most
PAIR_SWAPS = 64  # random one-for-two swaps offered per refinement step


@dataclass
class Changes:
    """C placements one move or swap away: the two changed devices, their states and
    occupancy."""

    devices: torch.Tensor
    states: torch.Tensor
    occupied: torch.Tensor

    @staticmethod
    def of_moves(
        moves: Sequence[tuple[int, int, int, int]],
        b: int,
        S: torch.Tensor,
        enc: torch.Tensor,
        alone: bool,
    ) -> Changes:
        """The changes of ``moves`` off device ``b`` of states ``S``."""
        m = torch.tensor(moves, dtype=torch.int64)
        ei = enc[m[:, 0]]
        ej = torch.where((m[:, 1] >= 0).unsqueeze(-1), enc[m[:, 1].clamp(min=0)], 0.0)
        ej = ej + torch.where((m[:, 2] >= 0).unsqueeze(-1), enc[m[:, 2].clamp(min=0)], 0.0)
        states = torch.stack([S[0, b] + (ej - ei), S[0, m[:, 3]] + (ei - ej)], dim=1)
        stays = m[:, 1] >= 0 if alone else torch.ones(len(m), dtype=torch.bool)
        occupied = torch.stack([stays, torch.ones_like(stays)], dim=1)
        return Changes(torch.stack([torch.full_like(m[:, 3], b), m[:, 3]], dim=1), states, occupied)


def moves(
    placement: np.ndarray,
    b: int,
    sizes: np.ndarray,
    capacity: np.ndarray,
    rng: np.random.Generator,
    pair_swaps: int = PAIR_SWAPS,
    limit: int = REFINE_CANDIDATES,
) -> list[tuple[int, int, int, int]]:
    """Legal changes ``(i, j, k, d)`` of the tables ``i`` on device ``b``: a move to ``d``
    (``j = k = -1``), a swap with ``j`` on ``d`` (``k = -1``), and up to ``pair_swaps`` swaps
    with two tables ``j, k`` of ``d``; at most ``limit`` moves and swaps.
    """
    used = np.bincount(placement, weights=sizes, minlength=len(capacity))
    free = capacity - used
    on_b = np.flatnonzero(placement == b)
    others = np.flatnonzero(placement != b)
    # moves: (table on b, device with room); swaps: (table on b, table elsewhere) pairs
    # that keep both devices within memory, sampled before any tuple is built
    mi, md = np.nonzero(free[None, :] >= sizes[on_b][:, None])
    keep = md != b
    mi, md = mi[keep], md[keep]
    si, sj = np.nonzero(
        (free[placement[others]][None, :] + sizes[others][None, :] >= sizes[on_b][:, None])
        & (free[b] + sizes[on_b][:, None] >= sizes[others][None, :])
    )
    # the moves, then the swaps, numbered in that order: a random ``limit`` of them
    pick = np.arange(len(mi) + len(si))
    if len(pick) > limit:
        pick = np.sort(rng.choice(len(pick), limit, replace=False))
    m, s = pick[pick < len(mi)], pick[pick >= len(mi)] - len(mi)
    j = others[sj[s]]
    both = np.stack(
        [
            np.concatenate([on_b[mi[m]], on_b[si[s]]]),
            np.concatenate([np.full(len(m), -1), j]),
            np.full(len(pick), -1),
            np.concatenate([md[m], placement[j]]),
        ],
        1,
    )
    out = [tuple(row) for row in both.tolist()]
    count = pair_swaps if others.size >= 2 else 0
    return out + _pair_swaps(placement, b, on_b, others, sizes, free, rng, count)


def _pair_swaps(
    placement: np.ndarray,
    b: int,
    on_b: np.ndarray,
    others: np.ndarray,
    sizes: np.ndarray,
    free: np.ndarray,
    rng: np.random.Generator,
    count: int,
) -> list[tuple[int, int, int, int]]:
    """Of ``count`` random draws ``(i, j, k)``, the pair swaps that keep both devices in memory."""
    on_device: dict[int, np.ndarray] = {}
    out = []
    for _ in range(count):
        i = int(on_b[rng.integers(0, len(on_b))])
        j = int(others[rng.integers(0, len(others))])
        d = int(placement[j])
        if d not in on_device:
            on_device[d] = np.flatnonzero(placement == d)
        same = on_device[d]
        k = int(same[rng.integers(0, len(same))])
        if k == j:
            continue
        pair = sizes[j] + sizes[k]
        if free[d] + pair >= sizes[i] and free[b] + sizes[i] >= pair:
            out.append((i, j, k, d))
    return out
