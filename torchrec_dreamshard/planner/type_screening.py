"""Screening the type choice's candidates fast, at thousands of tables on hundreds of ranks.

:class:`ScreeningRater` rates a candidate as
:class:`~torchrec_dreamshard.planner.type_rating.CandidateRater` does (the same placement,
the same terms from the sharding types' strategies), with the screening kernels, but never
builds the whole plan's terms. Every term the models price is linear in a few per-rank
quantities: a rank's kernel ms (screened: single-table kernels times their batch's fusion
ratio, :class:`~torchrec_dreamshard.cost.plans.ScreeningKernels`) and, per collective,
what each rank sends and receives within and across hosts
(:class:`~torchrec_dreamshard.cost.comm_topology.FlowTotals`) or its buffer. So:

* each table choice's part is reduced to those quantities once and reused while the
  choice repeats (the moved tables, whose ranks do not depend on the balance);
* a table-wise table's part on rank ``r`` is its part on rank 0 with the ranks relabelled
  by a host-preserving permutation ``s_r`` that swaps ``r`` and 0 (its host with host 0,
  its local index with 0): the terms of one rank's table look the same from every rank.
  A candidate's table-wise tables are summed per rank first and each rank's sum is
  relabelled once: ``O(n F W)`` array work for ``n`` tables and ``F`` quantities, with no
  term built, where the balance moved them. Hosts of unequal size have no such
  permutation: each table-wise choice is then reduced as the others are;
* each collective is priced once per candidate, on the sums.
"""

from __future__ import annotations

import math
from functools import cached_property

import numpy as np
from torchrec.distributed.planner.types import ShardingOption

from torchrec_dreamshard.cost.comm_topology import FlowTotals, all_to_all_ms, ring_ms
from torchrec_dreamshard.cost.plans import ScreeningKernels
from torchrec_dreamshard.cost.sharding import TableChoice, Terms, job_terms
from torchrec_dreamshard.planner.option_kinds import DREAMSHARD_SHARDING_TYPE
from torchrec_dreamshard.planner.type_rating import CandidateRater

Part = tuple[np.ndarray, list]  # ([W] kernel ms, [(collective key, totals or buffer)])


class ScreeningRater:
    """Screens candidates (see the module docstring).

    Args:
        rater: the candidate rater whose placement and terms it screens with (its context
            prices kernels with ``screen``).
        screen: the screening kernels, their fusion ratios calibrated.
    """

    def __init__(self, rater: CandidateRater, screen: ScreeningKernels) -> None:
        self.rater, self.screen, self.ctx = rater, screen, rater.ctx
        self._parts: dict[TableChoice, Part] = {}
        self._job = self._reduce(job_terms(self.ctx))
        self.count = 0
        topo = self.ctx.topology
        self._relabel = topo.world_size % topo.local_world_size == 0

    def __call__(self, moved: dict[str, ShardingOption]) -> float:
        self.count += 1
        placed = self.rater.balanced(moved)
        if placed is None:
            return math.inf
        choices = self.rater.moved_choices(moved)
        self._reduce_new(choices)
        parts = [self._job, *(self._parts[c] for c in choices)]
        if self._relabel:
            parts.append(self._table_wise_sum(placed))
        else:
            tw = [self._table_wise(i, r) for i, r in placed]
            self._reduce_new(tw)
            parts += [self._parts[c] for c in tw]
        kern = np.zeros(self.ctx.topology.world_size)
        shares: dict[tuple, list] = {}
        for k, values in parts:
            kern += k
            for key, value in values:
                shares.setdefault(key, []).append(value)
        comm = np.zeros(self.ctx.topology.world_size)
        for (_, kind, ranks), values in shares.items():
            comm += self._price(kind, ranks, values)
        return float((kern + comm).max())

    def _table_wise(self, i: int, rank: int) -> TableChoice:
        rater = self.rater
        return TableChoice(
            table=rater.specs[i],
            sharding_type=DREAMSHARD_SHARDING_TYPE,
            ranks=(rank,),
            pooled=rater.pooled[i],
        )

    def _reduce_new(self, choices: list[TableChoice]) -> None:
        """Reduce the parts of ``choices`` not seen yet, their new single-table kernels
        predicted in one call."""
        new = list(dict.fromkeys(c for c in choices if c not in self._parts))
        if not new:
            return
        terms = [self.rater.terms(c, self.ctx) for c in new]
        self.screen.summed([([k.table], k.batch) for t in terms for k in t.kernels if not k.dense])
        for c, t in zip(new, terms, strict=True):
            self._parts[c] = self._reduce(t)

    @cached_property
    def _rank0(self) -> tuple[np.ndarray, list[tuple], np.ndarray]:
        """Every table's table-wise part on rank 0 as rows ``[n, F, W]``: its kernel ms,
        then the four totals of each all-to-all (keys in order); ring buffers ``[n, R]``."""
        n, w = len(self.rater.specs), self.ctx.topology.world_size
        choices = [self._table_wise(i, 0) for i in range(n)]
        self._reduce_new(choices)
        parts = [self._parts[c] for c in choices]
        keys = sorted({key for _, shares in parts for key, _ in shares})
        a2a = [k for k in keys if k[1] == "all_to_all"]
        rings = [k for k in keys if k[1] != "all_to_all"]
        rows = np.zeros((n, 1 + 4 * len(a2a), w))
        buffers = np.zeros((n, len(rings)))
        for i, (kern, shares) in enumerate(parts):
            rows[i, 0] = kern
            for key, value in shares:
                if key in rings:
                    buffers[i, rings.index(key)] += value
                    continue
                at = 1 + 4 * a2a.index(key)
                for f, name in enumerate(FlowTotals.FIELDS):
                    rows[i, at + f] += getattr(value, name)
        return rows, a2a + rings, buffers

    @cached_property
    def _swaps(self) -> np.ndarray:
        """``[W, W]``: row ``r`` is the permutation ``s_r`` (module docstring)."""
        topo = self.ctx.topology
        w, lw = topo.world_size, topo.local_world_size
        j = np.arange(w)
        host, local = j // lw, j % lw
        out = np.empty((w, w), dtype=np.int64)
        for r in range(w):
            h = np.where(host == r // lw, 0, np.where(host == 0, r // lw, host))
            loc = np.where(local == r % lw, 0, np.where(local == 0, r % lw, local))
            out[r] = h * lw + loc
        return out

    def _table_wise_sum(self, placed: list[tuple[int, int]]) -> Part:
        """The part of every table-wise table of a candidate: summed per rank on rank 0's
        rows, each rank's sum relabelled to it, all summed."""
        rows, keys, buffers = self._rank0
        pairs = np.array(placed, dtype=np.int64).reshape(-1, 2)
        order = np.argsort(pairs[:, 1], kind="stable")
        idx, ranks = pairs[order, 0], pairs[order, 1]
        used, starts = np.unique(ranks, return_index=True)
        per_rank = np.add.reduceat(rows[idx], starts, axis=0) if len(idx) else rows[:0]
        moved = np.take_along_axis(per_rank, self._swaps[used][:, None, :], axis=2)
        total = moved.sum(axis=0) if len(idx) else np.zeros(rows.shape[1:])
        a2a = [k for k in keys if k[1] == "all_to_all"]
        shares: list = [
            (key, FlowTotals(*total[1 + 4 * n : 5 + 4 * n])) for n, key in enumerate(a2a)
        ]
        ring_sums = buffers[idx].sum(axis=0)
        shares += [(key, float(b)) for key, b in zip(keys[len(a2a) :], ring_sums, strict=True)]
        return total[0], shares

    def _reduce(self, terms: Terms) -> Part:
        """``terms`` as ``([W] kernel ms, [(collective key, totals or buffer), ...])``."""
        ctx, kern = self.ctx, np.zeros(self.ctx.topology.world_size)
        fused = [k for k in terms.kernels if not k.dense]
        times = self.screen([([k.table], k.batch) for k in fused])
        for k, (f, b) in zip(fused, times, strict=True):
            rf, rb = self.screen.ratio.get(k.batch, (1.0, 1.0))
            kern[k.rank] += f * rf + b * rb
        for k in terms.kernels:
            if k.dense and ctx.dense_kernel is not None:  # per table: screening only
                kern[k.rank] += sum(ctx.dense_kernel.ms([k.table], k.batch))
        for rank, nbytes in terms.dense_bytes:
            kern[rank] += nbytes / ctx.mem_bw
        shares = []
        for e in terms.exchanges:
            key = (e.tag, e.kind, tuple(sorted(e.ranks)))
            if e.kind != "all_to_all":
                shares.append((key, e.buffer_bytes))
            elif isinstance(e.flows, FlowTotals):
                shares.append((key, e.flows))
            else:
                shares.append((key, FlowTotals.from_matrix(ctx.topology, e.flows)))
        return kern, shares

    def _price(self, kind: str, ranks: tuple[int, ...], values: list) -> np.ndarray:
        """``[W]`` ms of one collective over the summed shares ``values``."""
        ctx = self.ctx
        if kind != "all_to_all":
            return ring_ms(ctx.topology, ctx.collectives, kind, ranks, float(sum(values)))
        total = FlowTotals(
            *(np.sum([getattr(v, a) for v in values], axis=0) for a in FlowTotals.FIELDS)
        )
        return all_to_all_ms(ctx.topology, ctx.collectives, ranks, total)
