"""Screening type candidates fast at scale (:class:`ScreeningRater`): the same placement and
terms as :class:`~.type_rating.CandidateRater`, with screening kernels, reduced to per-rank
quantities (kernel ms, :class:`~torchrec_dreamshard.cost.comm_topology.FlowTotals`, buffers)
that are linear in each term. A table-wise table's part on rank ``r`` is its part on rank
0 relabelled by a host-preserving permutation, so a candidate costs ``O(n F W)``."""

from __future__ import annotations

import math
from functools import cached_property
from typing import Any

import numpy as np
from torchrec.distributed.planner.types import ShardingOption

from torchrec_dreamshard.cost.comm_topology import FlowTotals, all_to_all_ms, ring_ms
from torchrec_dreamshard.cost.plans import ScreeningKernels
from torchrec_dreamshard.cost.sharding import PATH_KIND, TableChoice, Terms, job_terms, path_cost
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.planner.stages.option_kinds import DREAMSHARD_SHARDING_TYPE
from torchrec_dreamshard.planner.type_choice.type_rating import CandidateRater

Part = list[tuple[tuple, Any]]  # (what it joins, its share): see ScreeningRater._reduce
FUSED, DENSE = "fused kernel", "dense kernel"


class ScreeningRater:
    """Screens candidates (see the module docstring).

    Args:
        rater: the candidate rater whose placement and terms it screens with.
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
        shares: dict[tuple, list] = {}
        for part in parts:
            for key, value in part:
                shares.setdefault(key, []).append(value)
        total = np.zeros(self.ctx.topology.world_size)
        for key, values in shares.items():
            total += self._price(key, values)
        return float(total.max())

    def _table_wise(self, i: int, rank: int) -> TableChoice:
        rater = self.rater
        return TableChoice(
            table=rater.specs[i],
            sharding_type=DREAMSHARD_SHARDING_TYPE,
            ranks=(rank,),
            pooled=rater.pooled[i],
        )

    def _reduce_new(self, choices: list[TableChoice]) -> None:
        """Reduce the parts of ``choices`` not seen yet."""
        new = list(dict.fromkeys(c for c in choices if c not in self._parts))
        if not new:
            return
        terms = [self.rater.terms(c, self.ctx) for c in new]
        self.screen.summed([([k.table], k.batch) for t in terms for k in t.kernels if not k.dense])
        for c, t in zip(new, terms, strict=True):
            self._parts[c] = self._reduce(t)

    @cached_property
    def _rank0(self) -> tuple[np.ndarray, list[tuple], list[slice], np.ndarray, list[tuple]]:
        """Every table's table-wise part on rank 0 as ``[n, F, W]`` rows, and ring buffers ``[n,
        R]``."""
        n, w = len(self.rater.specs), self.ctx.topology.world_size
        choices = [self._table_wise(i, 0) for i in range(n)]
        self._reduce_new(choices)
        parts = [self._parts[c] for c in choices]
        rows_of = {key: _rows(value).shape[0] for p in parts for key, value in p if _is_rows(value)}
        if any(key[0] == DENSE and len(key) == 2 for p in parts for key, _ in p):
            raise ValueError("a table-wise part runs no dense kernel")
        keys = sorted(rows_of)
        at = np.cumsum([0] + [rows_of[k] for k in keys])
        spans = [slice(a, b) for a, b in zip(at[:-1], at[1:], strict=True)]
        rings = sorted({key for p in parts for key, value in p if not _is_rows(value)})
        rows, buffers = np.zeros((n, int(at[-1]), w)), np.zeros((n, len(rings)))
        for i, part in enumerate(parts):
            for key, value in part:
                if _is_rows(value):
                    rows[i, spans[keys.index(key)]] += _rows(value)
                else:
                    buffers[i, rings.index(key)] += value
        return rows, keys, spans, buffers, rings

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
        """The part of a candidate's table-wise tables, summed per rank on rank 0's rows."""
        rows, keys, spans, buffers, rings = self._rank0
        pairs = np.array(placed, dtype=np.int64).reshape(-1, 2)
        order = np.argsort(pairs[:, 1], kind="stable")
        idx, ranks = pairs[order, 0], pairs[order, 1]
        if not len(idx):
            return []
        used, starts = np.unique(ranks, return_index=True)
        per_rank = np.add.reduceat(rows[idx], starts, axis=0)
        total = np.take_along_axis(per_rank, self._swaps[used][:, None, :], axis=2).sum(axis=0)
        part: Part = [
            (key, _value(key, total[span])) for key, span in zip(keys, spans, strict=True)
        ]
        sums = buffers[idx].sum(axis=0)
        return part + [(key, float(b)) for key, b in zip(rings, sums, strict=True)]

    def _reduce(self, terms: Terms) -> Part:
        """``terms`` as ``[(key, share)]`` per kernel group, dense kernel and collective."""
        ctx, w = self.ctx, self.ctx.topology.world_size
        part: Part = []
        fused = [k for k in terms.kernels if not k.dense]
        times = self.screen.summed([([k.table], k.batch) for k in fused])
        groups: dict[tuple, np.ndarray] = {}
        for k, (f, b) in zip(fused, times, strict=True):
            arr = groups.setdefault((FUSED, k.group, k.batch), np.zeros((3, w)))
            arr[:, k.rank] += (f, b, 1.0)
        part += list(groups.items())
        for k in terms.kernels:
            if k.dense:
                part.append(((DENSE, k.batch), [(k.rank, k.table)]))
        if terms.dense_bytes:
            passes = np.zeros(w)
            for rank, nbytes in terms.dense_bytes:
                passes[rank] += nbytes / ctx.mem_bw
            part.append(((DENSE,), passes))
        for e in terms.exchanges:
            key = (e.tag, e.kind, tuple(sorted(e.ranks)))
            if e.kind != "all_to_all":
                part.append((key, e.buffer_bytes))
            elif isinstance(e.flows, FlowTotals):
                part.append((key, e.flows))
            else:
                part.append((key, FlowTotals.from_matrix(ctx.topology, e.flows)))
        return part

    def _price(self, key: tuple, values: list) -> np.ndarray:
        """``[W]`` ms of one kernel group, dense kernels or collective, ``values`` summed first."""
        ctx = self.ctx
        if key[0] == FUSED:
            f, b, n = np.sum(values, axis=0)
            rf, rb = self.screen.ratio.get(key[2], (1.0, 1.0))
            return np.where(n > 1, f * rf + b * rb, f + b)  # fusion ratios: groups of 2+
        if key == (DENSE,):
            return np.sum(values, axis=0)
        if key[0] == DENSE:
            return self._dense_ms(key[1], [c for v in values for c in v])
        kind, ranks = key[1], key[2]
        if kind == PATH_KIND:
            return path_cost(ranks, ctx)
        if kind != "all_to_all":
            return ring_ms(ctx.topology, ctx.collectives, kind, ranks, float(sum(values)))
        total = FlowTotals(
            *(np.sum([getattr(v, a) for v in values], axis=0) for a in FlowTotals.FIELDS)
        )
        return all_to_all_ms(ctx.topology, ctx.collectives, ranks, total)

    def _dense_ms(self, batch: int, calls: list[tuple[int, TableSpec]]) -> np.ndarray:
        """``[W]`` ms of each rank's dense kernel over its tables."""
        out, by_rank = np.zeros(self.ctx.topology.world_size), {}
        for rank, table in calls:
            by_rank.setdefault(rank, []).append(table)
        priced: dict[tuple, float] = {}
        for rank, tables in by_rank.items():
            ids = tuple(id(t) for t in tables)
            if ids not in priced:
                priced[ids] = sum(self.ctx.dense_kernel.ms(tables, batch))
            out[rank] = priced[ids]
        return out


def _is_rows(value: Any) -> bool:
    return isinstance(value, np.ndarray | FlowTotals)


def _rows(value: np.ndarray | FlowTotals) -> np.ndarray:
    """A share as ``[k, W]`` rows."""
    if isinstance(value, FlowTotals):
        return np.stack([getattr(value, a) for a in FlowTotals.FIELDS])
    return value.reshape(-1, value.shape[-1])


def _value(key: tuple, rows: np.ndarray) -> np.ndarray | FlowTotals:
    """Rows back as the share ``key`` takes: totals for an all-to-all."""
    if key[0] in (FUSED, DENSE):
        return rows if key[0] == FUSED else rows[0]
    return FlowTotals(*rows)
