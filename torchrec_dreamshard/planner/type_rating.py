"""Rating a sharding-type candidate: which tables leave table-wise for which option, the
rest balanced greedily in the memory left, the whole plan priced by the typed cost model
(:func:`torchrec_dreamshard.cost.plans.plan_cost`); and a partitioned plan as that model
sees it."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from torchrec.distributed.planner.types import ShardingOption

from torchrec_dreamshard.cost.plans import (
    PlanBreakdown,
    plan_breakdown,
    plan_cost,
)
from torchrec_dreamshard.cost.sharding import TableChoice
from torchrec_dreamshard.cost.sharding_types import (
    BY_TORCHREC_TYPE,
    STRATEGIES,
    TermsCache,
)
from torchrec_dreamshard.planner.device_memory import option_bytes, storage_bytes
from torchrec_dreamshard.planner.option_kinds import DREAMSHARD_SHARDING_TYPE
from torchrec_dreamshard.planner.option_specs import SpecFn

PREFIX_GROWTH = 4  # each candidate of a type moves this many times the tables of the last


class CandidateRater:
    """Rates a candidate (which tables move to which option): the moved tables' memory
    and ranks as their strategies say, the table-wise tables balanced greedily in the
    memory left, the whole plan priced by :func:`plan_cost` with the kernels of ``ctx``;
    ``inf`` when the table-wise tables do not fit."""

    def __init__(self, ctx, ours, specs, costs, capacity, tier, terms=None) -> None:
        self.ctx, self.ours, self.specs, self.costs = ctx, ours, specs, costs
        self.capacity = np.asarray(capacity, dtype=np.float64)
        self.tier = tier
        self.need = np.array([option_bytes(o, tier) for o in ours], dtype=np.float64)
        self.pooled = [bool(o.is_pooled) for o in ours]  # a sequence table is not
        self.terms = TermsCache() if terms is None else terms
        self.count = 0

    def __call__(self, moved: dict[str, ShardingOption]) -> float:
        self.count += 1
        choices = self._choices(moved)
        return math.inf if choices is None else plan_cost(choices, self.ctx, self.terms).step_ms

    def breakdown(self, moved: dict[str, ShardingOption]) -> PlanBreakdown:
        """The plan of ``moved`` priced by source (it must fit)."""
        choices = self._choices(moved)
        if choices is None:
            raise ValueError("the candidate does not fit the devices' memory")
        return plan_breakdown(choices, self.ctx, self.terms)

    def balanced(self, moved: dict[str, ShardingOption]) -> list[tuple[int, int]] | None:
        """``(table index, rank)`` of the table-wise tables of ``moved``'s plan."""
        free = self.capacity.copy()
        for option in moved.values():
            shard_bytes = [storage_bytes(s.storage, self.tier) for s in option.shards]
            STRATEGIES[option.sharding_type].reserve(shard_bytes, free)
        if (free < 0).any():
            return None
        return self._balance([i for i, o in enumerate(self.ours) if o.fqn not in moved], free)

    def _choices(self, moved: dict[str, ShardingOption]) -> list[TableChoice] | None:
        ranks = self.balanced(moved)
        if ranks is None:
            return None
        tw = DREAMSHARD_SHARDING_TYPE
        choices = [TableChoice(table=self.specs[i], sharding_type=tw, ranks=(r,)) for i, r in ranks]
        topo, turns = self.ctx.topology, dict.fromkeys(STRATEGIES, 0)
        for i, o in enumerate(self.ours):
            if o.fqn in moved:
                kind = moved[o.fqn].sharding_type
                r = STRATEGIES[kind].candidate_ranks(turns[kind], topo)
                turns[kind] += 1
                choices.append(
                    TableChoice(
                        table=self.specs[i], sharding_type=kind, ranks=r, pooled=self.pooled[i]
                    )
                )
        return choices

    def _balance(self, idx: list[int], free: np.ndarray) -> list[tuple[int, int]] | None:
        load = np.zeros(len(free))
        out = []
        for i in sorted(idx, key=lambda i: (-self.costs[i], i)):
            room = np.flatnonzero(free >= self.need[i])
            if room.size == 0:
                return None
            r = int(room[np.argmin(load[room])])
            free[r] -= self.need[i]
            load[r] += self.costs[i]
            out.append((i, r))
        return out


def typed_choices(plan: Sequence[ShardingOption], spec_fn: SpecFn) -> list[TableChoice]:
    """The tables of a partitioned plan as the typed cost model sees them: each option's
    type by the strategy that prices it (TorchRec's table-column-wise as column-wise), its
    ranks as the strategy takes them; a sequence table is unpooled.

    Raises:
        ValueError: a sharding type no strategy prices (named).
    """
    out = []
    for o in plan:
        strategy = BY_TORCHREC_TYPE.get(o.sharding_type)
        if strategy is None:
            raise ValueError(f"{o.fqn}: sharding type {o.sharding_type!r} is not priced")
        ranks = strategy.option_ranks([int(s.rank) for s in o.shards])
        out.append(
            TableChoice(
                table=spec_fn(o), sharding_type=strategy.name, ranks=ranks, pooled=o.is_pooled
            )
        )
    return out
