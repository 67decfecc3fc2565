"""Search mode's refinement: hill-climbing a placement on the cost network's step cost
by moves and swaps off the predicted bottleneck device."""

from __future__ import annotations

import numpy as np
import torch

from torchrec_dreamshard.policy.mdp import EstimatedMDP

REFINE_STEPS = 64  # improving moves/swaps search mode makes after its roll-outs
REFINE_CANDIDATES = 512  # moves/swaps rated per refinement step, at most


@torch.no_grad()
def refine(mdp: EstimatedMDP, placement: np.ndarray, max_steps: int, seed: int = 0) -> np.ndarray:
    """Hill-climb ``placement`` on the cost network's step cost.

    Each step rates, in one batch, every move of a table off the predicted bottleneck
    device to another device with room and every swap of such a table with a table
    elsewhere that keeps both devices within memory (a random ``REFINE_CANDIDATES`` of
    them when there are more), and applies the best if it lowers the predicted step; it
    stops at a local optimum or after ``max_steps``.
    """
    net, task = mdp.net, mdp.task
    enc = torch.empty_like(mdp.enc)
    enc[torch.from_numpy(mdp.order)] = mdp.enc  # back to table order
    sizes = np.array([t.size_bytes for t in task.tables], dtype=np.float64)
    D = mdp.D
    placement = placement.copy()
    rng = np.random.default_rng(seed)
    for _ in range(max_steps):
        S = torch.zeros(D, enc.shape[1]).index_add(0, torch.from_numpy(placement), enc)
        occ = torch.from_numpy(np.bincount(placement, minlength=D) > 0)
        log_dev = net.device_log_costs(S, mdp.ctx)
        now = float(net.overall_log_cost(S, log_dev, occ))
        b = int(torch.logsumexp(log_dev, -1).masked_fill(~occ, -1e30).argmax())
        cands = _candidates(placement, b, sizes, mdp.capacity)
        if not cands:
            break
        if len(cands) > REFINE_CANDIDATES:  # bound the work on big tasks
            keep = rng.choice(len(cands), REFINE_CANDIDATES, replace=False)
            cands = [cands[k] for k in sorted(keep)]
        moves = torch.tensor(cands, dtype=torch.int64)  # (i, j or -1, d)
        C = len(cands)
        S_c = S.expand(C, D, -1).clone()
        rows = torch.arange(C)
        ei = enc[moves[:, 0]]
        ej = torch.where((moves[:, 1] >= 0).unsqueeze(-1), enc[moves[:, 1].clamp(min=0)], 0.0)
        S_c[rows, b] += ej - ei
        S_c[rows, moves[:, 2]] += ei - ej
        occ_c = occ.expand(C, D).clone()
        occ_c[rows, moves[:, 2]] = True
        pl_counts = np.bincount(placement, minlength=D)
        if pl_counts[b] == 1:
            occ_c[rows, b] = moves[:, 1] >= 0
        cost = net.overall_log_cost(S_c, net.device_log_costs(S_c, mdp.ctx), occ_c)
        k = int(torch.argmin(cost))
        if float(cost[k]) >= now - 1e-6:
            break
        i, j, d = cands[k]
        placement[i] = d
        if j >= 0:
            placement[j] = b
    return placement


def _candidates(
    placement: np.ndarray, b: int, sizes: np.ndarray, capacity: np.ndarray
) -> list[tuple[int, int, int]]:
    """Legal moves ``(i, -1, d)`` and swaps ``(i, j, d)`` of tables ``i`` on device ``b``."""
    used = np.bincount(placement, weights=sizes, minlength=len(capacity))
    free = capacity - used
    on_b = np.flatnonzero(placement == b)
    others = np.flatnonzero(placement != b)
    out = []
    for i in on_b:
        for d in np.flatnonzero(free >= sizes[i]):
            if d != b:
                out.append((int(i), -1, int(d)))
        if others.size:
            d_j = placement[others]
            ok = (free[d_j] + sizes[others] >= sizes[i]) & (free[b] + sizes[i] >= sizes[others])
            out.extend((int(i), int(j), int(placement[j])) for j in others[ok])
    return out
