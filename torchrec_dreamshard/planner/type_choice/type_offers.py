"""Which other sharding types the enumerator offers each table, pruned by each type's
``may_gain`` so the search space stays small at scale."""

from __future__ import annotations

from torch import nn
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from torchrec_dreamshard.cost.comm_topology import CommTopology
from torchrec_dreamshard.cost.sharding import OfferScope
from torchrec_dreamshard.cost.sharding_types import alternative_kernels, alternative_types
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.policy.agent import LARGE_TASK


def offered_types(
    module: nn.Module,
    topology: Topology,
    local_batch: int,
    constraints: dict[str, ParameterConstraints] | None = None,
) -> dict[str, dict[str, str]]:
    """Per table of ``module``'s ``EmbeddingBagCollection``s, the alternative types (and
    kernels) whose strategy says moving it may lower the step; below
    :data:`~torchrec_dreamshard.policy.agent.LARGE_TASK` tables x devices, every type."""
    constraints = constraints or {}
    tables = []
    for m in module.modules():
        if isinstance(m, EmbeddingBagCollection):
            for c in m.embedding_bag_configs():
                pf = constraints.get(c.name)
                pooling = pf.pooling_factors if pf is not None and pf.pooling_factors else [1.0]
                tables.append(
                    TableSpec(
                        name=c.name,
                        rows=int(c.num_embeddings),
                        dim=int(c.embedding_dim),
                        pooling_factor=float(sum(pooling)),
                    )
                )
    if not tables:
        return {}
    topo = CommTopology.from_torchrec(topology)
    lookups = sum(t.pooling_factor * t.dim for t in tables) / topo.world_size
    prune = len(tables) * topo.world_size > LARGE_TASK
    scope = OfferScope(
        topology=topo, local_batch=float(local_batch), mean_lookups=lookups, prune=prune
    )
    kernels = alternative_kernels()
    return {
        t.name: {s.name: kernels[s.name] for s in alternative_types() if s.may_gain(t, True, scope)}
        for t in tables
    }
