"""Hosts in the communication terms: a collective costs each rank its fit plus the bytes it
moves across hosts over ``inter_host_bw`` (analytic; not added where the fit was timed over
several hosts). Rank ``r`` lives on host ``r // local_world_size``, as in TorchRec.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from torchrec_dreamshard.cost.collective_models import CollectiveModels
from torchrec_dreamshard.cost.comm_model import CommModel
from torchrec_dreamshard.measure.collective_timing import COLLECTIVES, check_kind, wire_megabytes

INTRA_HOST_BW: float = 600 * 1024**3 / 1000  # bytes/ms; TorchRec's INTRA_NODE_BANDWIDTH
INTER_HOST_BW: float = 12.5 * 1024**3 / 1000  # bytes/ms; TorchRec's CROSS_NODE_BANDWIDTH
_RING_CROSS = {"reduce_scatter": 1.0, "all_gather": 1.0, "all_reduce": 2.0}


@dataclass(frozen=True, kw_only=True)
class CommTopology:
    """Ranks, hosts and link bandwidths, as TorchRec's ``Topology`` gives them.

    Args:
        local_world_size: ranks per host (``None``: all on one host).
        intra_host_bw: bytes/ms between ranks of a host (:func:`analytic_models` only).
        inter_host_bw: bytes/ms of one rank's link to other hosts.
    """

    world_size: int
    local_world_size: int | None = None
    intra_host_bw: float = INTRA_HOST_BW
    inter_host_bw: float = INTER_HOST_BW

    def __post_init__(self) -> None:
        w = self.world_size
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ValueError(f"world_size must be an integer >= 1, got {w!r}")
        local = w if self.local_world_size is None else self.local_world_size
        if isinstance(local, bool) or not isinstance(local, int) or not 1 <= local <= w:
            raise ValueError(f"local_world_size must be an integer in 1..{w}, got {local!r}")
        object.__setattr__(self, "local_world_size", local)
        for name in ("intra_host_bw", "inter_host_bw"):
            bw = getattr(self, name)
            if not (isinstance(bw, int | float) and np.isfinite(bw) and bw > 0):
                raise ValueError(f"{name} must be a positive number of bytes/ms, got {bw!r}")

    @classmethod
    def from_torchrec(cls, topology: Any) -> CommTopology:
        """From a TorchRec ``Topology``, in TorchRec's units."""
        return cls(
            world_size=int(topology.world_size),
            local_world_size=int(topology.local_world_size),
            intra_host_bw=float(topology.intra_host_bw),
            inter_host_bw=float(topology.inter_host_bw),
        )

    @property
    def num_hosts(self) -> int:
        return -(-self.world_size // self.local_world_size)

    @cached_property
    def hosts(self) -> np.ndarray:
        """``[W]`` the host of every rank (read-only)."""
        out = np.arange(self.world_size) // self.local_world_size
        out.flags.writeable = False
        return out

    @cached_property
    def host_sizes(self) -> np.ndarray:
        """``[W]`` the ranks on every rank's host, itself included (read-only)."""
        out = np.bincount(self.hosts)[self.hosts]
        out.flags.writeable = False
        return out

    def host_of(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is out of range 0..{self.world_size - 1}")
        return rank // self.local_world_size

    def host_ranks(self, host: int) -> tuple[int, ...]:
        if not 0 <= host < self.num_hosts:
            raise ValueError(f"host {host} is out of range 0..{self.num_hosts - 1}")
        start = host * self.local_world_size
        return tuple(range(start, min(start + self.local_world_size, self.world_size)))

    def crosses_hosts(self, ranks: Sequence[int]) -> bool:
        """Whether a collective over ``ranks`` involves more than one host."""
        return len({self.host_of(r) for r in ranks}) > 1

    def remote_mask(self) -> np.ndarray:
        """``[W, W]`` booleans: whether ranks ``i`` and ``j`` are on different hosts."""
        return self.hosts[:, None] != self.hosts[None, :]

    def ring_cross_bytes(self, kind: str, ranks: Sequence[int], buffer_bytes: float) -> float:
        """Bytes one rank moves across hosts in a ring collective of ``buffer_bytes``:
        ``(H - 1) / H * S / n`` over ``H`` hosts of ``n`` ranks (all-reduce twice that), at
        the thinnest host."""
        if check_kind(kind) not in _RING_CROSS:
            raise ValueError(f"{kind!r} is not a ring collective; give its flows")
        per_host: dict[int, int] = {}
        for r in ranks:
            per_host[self.host_of(r)] = per_host.get(self.host_of(r), 0) + 1
        h = len(per_host)
        if h <= 1:
            return 0.0
        return _RING_CROSS[kind] * (h - 1) / h * buffer_bytes / min(per_host.values())


@dataclass(frozen=True, eq=False)
class FlowTotals:
    """An all-to-all's flows as per-rank totals (``[W]`` each, own slice excluded): bytes
    sent, received, and the cross-host part of each; they add in ``O(W)`` per table."""

    sent: np.ndarray
    recv: np.ndarray
    remote_sent: np.ndarray
    remote_recv: np.ndarray
    FIELDS: ClassVar[tuple[str, ...]] = ("sent", "recv", "remote_sent", "remote_recv")

    @classmethod
    def from_matrix(cls, topo: CommTopology, flows: np.ndarray) -> FlowTotals:
        """From ``[W, W]`` bytes rank ``i`` sends rank ``j`` (the diagonal is ignored)."""
        f = np.array(flows, dtype=np.float64)
        if f.shape != (topo.world_size,) * 2:
            raise ValueError(f"flows must be [{topo.world_size}, {topo.world_size}], got {f.shape}")
        np.fill_diagonal(f, 0.0)
        remote = np.where(topo.remote_mask(), f, 0.0)
        return cls(f.sum(1), f.sum(0), remote.sum(1), remote.sum(0))

    @classmethod
    def outer(cls, topo: CommTopology, src: np.ndarray, dst: np.ndarray) -> FlowTotals:
        """Flows ``F[i, j] = src[i] * dst[j]`` (``i != j``), in ``O(W)``."""
        u, v = np.asarray(src, dtype=np.float64), np.asarray(dst, dtype=np.float64)
        hosts = topo.hosts
        u_host = np.bincount(hosts, weights=u, minlength=topo.num_hosts)[hosts]
        v_host = np.bincount(hosts, weights=v, minlength=topo.num_hosts)[hosts]
        return cls(
            u * (v.sum() - v), v * (u.sum() - u), u * (v.sum() - v_host), v * (u.sum() - u_host)
        )

    @classmethod
    def one_to_all(cls, topo: CommTopology, rank: int, nbytes: float) -> FlowTotals:
        """``rank`` sends ``nbytes`` to every other rank."""
        w = topo.world_size
        sent, remote_sent = np.zeros(w), np.zeros(w)
        sent[rank] = nbytes * (w - 1)
        remote_sent[rank] = nbytes * (w - topo.host_sizes[rank])
        recv = np.full(w, float(nbytes))
        recv[rank] = 0.0
        remote_recv = np.where(topo.hosts != topo.hosts[rank], float(nbytes), 0.0)
        return cls(sent, recv, remote_sent, remote_recv)

    def __add__(self, other: FlowTotals) -> FlowTotals:
        return FlowTotals(
            self.sent + other.sent,
            self.recv + other.recv,
            self.remote_sent + other.remote_sent,
            self.remote_recv + other.remote_recv,
        )

    @property
    def T(self) -> FlowTotals:  # noqa: N802 (as numpy's transpose reads)
        """The reverse exchange: what each rank sent it receives."""
        return FlowTotals(self.recv, self.sent, self.remote_recv, self.remote_sent)

    def copy(self) -> FlowTotals:
        """Itself: the totals are never changed in place."""
        return self


def all_to_all_ms(
    topo: CommTopology,
    models: CollectiveModels,
    ranks: Sequence[int],
    flows: np.ndarray | FlowTotals,
) -> np.ndarray:
    """``[W]`` ms of one all-to-all over ``ranks`` (0 outside): fit plus cross-host term.

    Args:
        flows: ``[W, W]`` bytes rank ``i`` sends rank ``j``, or their :class:`FlowTotals`.
    """
    group = sorted(set(ranks))
    if not isinstance(flows, FlowTotals):
        flows = FlowTotals.from_matrix(topo, flows)
    model = models.models[check_kind("all_to_all")]
    out = np.zeros(topo.world_size)
    if len(group) <= 1:
        return out
    idx = np.asarray(group)
    mb = (flows.sent[idx] + flows.recv[idx]) / 1e6  # the fit is linear: one call for all
    cross = np.maximum(flows.remote_sent[idx], flows.remote_recv[idx])
    out[idx] = model.collective_ms(len(group), mb) + cross_host_ms(topo, models, cross)
    return out


def cross_host_ms(topo: CommTopology, models: CollectiveModels, cross_bytes: Any) -> Any:
    """The analytic cross-host term, unless ``models`` were timed over several hosts."""
    return 0.0 * cross_bytes if models.hosts > 1 else cross_bytes / topo.inter_host_bw


def ring_ms(
    topo: CommTopology,
    models: CollectiveModels,
    kind: str,
    ranks: Sequence[int],
    buffer_bytes: float,
) -> np.ndarray:
    """``[W]`` ms of one reduce-scatter, all-gather or all-reduce over ``ranks``."""
    out = np.zeros(topo.world_size)
    group = sorted(set(ranks))
    mb = wire_megabytes(kind, len(group), buffer_bytes)
    cross = topo.ring_cross_bytes(kind, group, buffer_bytes)
    for r in group:
        out[r] = models.ms(kind, len(group), mb) + cross_host_ms(topo, models, cross)
    return out


def analytic_models(topo: CommTopology) -> CollectiveModels:
    """Unmeasured collective models from ``topo.intra_host_bw`` alone (no latency)."""
    ms_per_mb = 1e6 / 2.0 / topo.intra_host_bw
    source = f"analytic: intra_host_bw {topo.intra_host_bw:.4g} bytes/ms, unmeasured"
    model = CommModel(latency_ms=0.0, per_peer_ms=0.0, ms_per_mb=ms_per_mb, source=source)
    return CollectiveModels(
        backend="analytic", models=dict.fromkeys(COLLECTIVES, model), source=source
    )
