"""Whether tables can still be packed into the devices' memory: the look-ahead every
placement step applies."""

from __future__ import annotations

import numpy as np


def ffd_fits(sizes: np.ndarray, free: np.ndarray) -> bool:
    """Whether first-fit-decreasing packs ``sizes`` into capacities ``free``."""
    free = free.astype(np.float64).copy()
    for s in np.sort(sizes)[::-1]:
        ok = np.flatnonzero(free >= s)
        if ok.size == 0:
            return False
        free[ok[0]] -= s
    return True


def can_pack(rest: np.ndarray, free: np.ndarray, d: int, size: float) -> bool:
    """Whether the tables ``rest`` (sizes descending) still pack after ``size`` goes to ``d``
    (an any-fit bound, else first-fit decreasing)."""
    if rest.size == 0:
        return True
    trial = free.astype(np.float64)  # a copy
    trial[d] -= size
    # the room above the largest exceeds all that is left: decided in O(D)
    if np.maximum(trial - rest[0], 0.0).sum() > rest.sum():
        return True
    before = np.concatenate([[0.0], np.cumsum(rest)[:-1]])
    if (np.maximum(trial[None, :] - rest[:, None], 0.0).sum(1) > before).all():
        return True
    return ffd_fits(rest, trial)


class PackingCheck:
    """:func:`can_pack` along one placement order (``sizes``), decided for every device at
    once; exact below 2^53 bytes (beyond, every check is :func:`can_pack`'s own)."""

    def __init__(self, sizes: np.ndarray, capacity: np.ndarray):
        self.sizes = np.asarray(sizes, dtype=np.float64)
        rev = self.sizes[::-1]
        self.rest_max = np.concatenate([np.maximum.accumulate(rev)[::-1][1:], [0.0]])
        self.rest_sum = np.concatenate([np.cumsum(rev)[::-1][1:], [0.0]])
        self.D = len(capacity)
        self.exact = max(self.sizes.sum(), self.D * float(np.max(capacity))) < 2.0**53

    def surely_packable(self, n: int, free_total: float) -> bool:
        """Whether the tables after step ``n`` surely pack wherever table ``n`` goes."""
        if n + 1 >= len(self.sizes):
            return True
        left = free_total - self.D * self.rest_max[n] - self.sizes[n]
        return self.exact and left > self.rest_sum[n]

    def first_packable(self, n: int, free: np.ndarray, devices: np.ndarray) -> int:
        """The first of ``devices`` from which the tables after step ``n`` still pack (else
        the first device)."""
        if n + 1 >= len(self.sizes):
            return int(devices[0])
        size = self.sizes[n]
        bound = self._bound(n, free, size) if self.exact else np.zeros(len(free), dtype=bool)
        rest = None
        for d in devices:
            if bound[d]:
                return int(d)
            if rest is None:
                rest = np.sort(self.sizes[n + 1 :])[::-1]
            if can_pack(rest, free, int(d), size):
                return int(d)
        return int(devices[0])

    def _bound(self, n: int, free: np.ndarray, size: float) -> np.ndarray:
        """``[D]``: ``sum_j max(free_j - s_max, 0) > remaining`` with ``free_d`` less ``size``."""
        room = np.maximum(free - self.rest_max[n], 0.0)
        after = np.maximum(free - size - self.rest_max[n], 0.0)
        return room.sum() - room + after > self.rest_sum[n]
