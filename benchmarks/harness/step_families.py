"""The step-time families: DLRM-shaped models whose tables pull the sharding-type choice
each its own way, for judging plans by the training step (``benchmarks/step_time.py``,
``benchmarks/feedback.py``). Each is deterministic.

* ``tiny``: 100 small tables (replication pays);
* ``huge_hot``: three huge, hot tables and four small ones;
* ``wide``: 8 tables of dim 256 or 512;
* ``sequence``: 6 sequence (``EmbeddingCollection``) tables beside 10 bags;
* ``mixed``: 80 tiny tables, 2 huge hot ones, 8 medium ones;
* ``undeclared``: 4 small tables fed long id lists (pooling 40 to 100) beside 8 large ones
  fed one to four ids, and planners told nothing of it (no ``pooling_factors``: TorchRec's
  1.0 per feature), as where a user passes no constraints;
* ``stale``: the same tables, and planners told pooling factors that have gone stale: the
  two long lists fed most are declared the longest and the shortest, the other two the
  middle values (what balancing the declared lists pairs together is the two longest).
"""

from __future__ import annotations

import math

import numpy as np

from torchrec_dreamshard.data.families import zipf_reuse_hist
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.evaluation.step_model import StepModelSpec

FAMILIES = ("tiny", "huge_hot", "wide", "sequence", "mixed", "undeclared", "stale")
WORLD = 2  # gloo ranks the families' DMP steps are timed on (one per core here)


def draw_tables(prefix, n, rng, batch, rows, dims, pooling, zipf=(0.0, 0.0)) -> list[TableSpec]:
    """``n`` tables: rows and pooling log-uniform in their ranges, a dim from ``dims``,
    the reuse of a Zipf exponent drawn in ``zipf`` at the per-rank batch ``batch``."""
    out = []
    for i in range(n):
        r = rows if isinstance(rows, int) else int(math.exp(rng.uniform(*np.log(rows))))
        p = round(float(math.exp(rng.uniform(*np.log(pooling)))), 3)
        s = float(rng.uniform(*zipf))
        hist = zipf_reuse_hist(r, int(round(batch * p)), s, rng)
        dim = int(rng.choice(dims))
        out.append(
            TableSpec(name=f"{prefix}{i}", rows=r, dim=dim, pooling_factor=p, reuse_hist=hist)
        )
    return out


def huge_hot(prefix, rows, rng, batch) -> list[TableSpec]:
    return [
        t
        for i, r in enumerate(rows)
        for t in draw_tables(f"{prefix}{i}_", 1, rng, batch, r, (64,), (20, 50), (1.0, 1.2))
    ]


def stale_constraints(lists: list[TableSpec], ids: list[TableSpec]) -> dict:
    """Pooling factors as declared for the ``stale`` family: the ids' as fed; the lists'
    fed (a < b < c < d) declared so that the tables fed c and d are declared the extremes
    (d and a) and those fed a and b the middle (b and c)."""
    from torchrec.distributed.planner.types import ParameterConstraints

    order = sorted(lists, key=lambda t: t.pooling_factor)  # fed a, b, c, d
    fed = [t.pooling_factor for t in order]
    declared = {order[0].name: fed[1], order[1].name: fed[2], order[2].name: fed[0]}
    declared[order[3].name] = fed[3]
    out = {t.name: ParameterConstraints(pooling_factors=[t.pooling_factor]) for t in ids}
    out.update({n: ParameterConstraints(pooling_factors=[p]) for n, p in declared.items()})
    return out


def family_spec(name: str, batch: int) -> StepModelSpec:
    """The model of family ``name`` (deterministic)."""
    if name not in FAMILIES:
        raise ValueError(f"unknown family {name!r}; known: {list(FAMILIES)}")
    rng = np.random.default_rng(FAMILIES.index(name))
    tiny = dict(rows=(20, 2000), dims=(8, 16), pooling=(1, 4), zipf=(0.0, 0.5))
    if name == "tiny":
        return StepModelSpec(bags=draw_tables("tiny", 100, rng, batch, **tiny))
    if name == "huge_hot":
        small = draw_tables("small", 4, rng, batch, (1000, 10_000), (16,), (1, 3))
        return StepModelSpec(
            bags=huge_hot("huge", (1_000_000, 600_000, 400_000), rng, batch) + small
        )
    if name == "wide":
        return StepModelSpec(
            bags=draw_tables("wide", 8, rng, batch, (5000, 40_000), (256, 512), (2, 8), (0.5, 1.0))
        )
    if name == "sequence":
        seqs = draw_tables("seq", 6, rng, batch, (10_000, 100_000), (32,), (10, 30), (0.6, 1.0))
        bags = draw_tables(
            "bag", 10, rng, batch, (1000, 100_000), (16, 32, 64), (1, 10), (0.3, 1.0)
        )
        return StepModelSpec(bags=bags, sequences=seqs)
    if name in ("undeclared", "stale"):
        rng = np.random.default_rng(FAMILIES.index("undeclared"))
        lists = draw_tables("list", 4, rng, batch, (2000, 20_000), (64,), (40, 100), (0.5, 1.0))
        ids = draw_tables("id", 8, rng, batch, (50_000, 300_000), (64,), (1, 4), (0.3, 1.0))
        if name == "undeclared":
            return StepModelSpec(bags=lists + ids, constraints={})
        return StepModelSpec(bags=lists + ids, constraints=stale_constraints(lists, ids))
    bags = draw_tables("tiny", 80, rng, batch, **tiny)  # mixed
    bags += huge_hot("huge", (800_000, 500_000), rng, batch)
    bags += draw_tables("med", 8, rng, batch, (20_000, 200_000), (32, 64, 128), (2, 20), (0.5, 1.0))
    return StepModelSpec(bags=bags)
