"""``CostNetShardEstimator``: the perf of the options DreamShard places, from the cost
network's single-table costs; every other option keeps TorchRec's perf estimator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torchrec.distributed.planner.constants import DEFAULT_PERF_ESTIMATOR
from torchrec.distributed.planner.estimator import EmbeddingPerfEstimatorFactory
from torchrec.distributed.planner.types import (
    ParameterConstraints,
    Perf,
    SharderDataMap,
    ShardEstimator,
    ShardingOption,
    Topology,
)

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.planner.plans.plan_prediction import prediction_task
from torchrec_dreamshard.planner.stages.option_kinds import is_dreamshard_option
from torchrec_dreamshard.planner.stages.option_specs import SpecFn, spec_for_option
from torchrec_dreamshard.policy.protocol import PlacementAgent


class CostNetShardEstimator(ShardEstimator):
    """Fills the perf of DreamShard options from the cost network, of the others from
    TorchRec's default perf estimator.

    Args:
        agent: the DreamShard agent whose cost network rates the tables.
        batch_size: the *global* batch (TorchRec's per-rank batch times the world size).
        spec_fn: turns an option into a :class:`TableSpec`.
        policy_table: whether a table (by name) is one the policy places.
    """

    def __init__(
        self,
        topology: Topology,
        constraints: dict[str, ParameterConstraints] | None = None,
        agent: PlacementAgent | None = None,
        batch_size: int = 512,
        spec_fn: SpecFn | None = None,
        policy_table: Callable[[str], bool] | None = None,
    ) -> None:
        if agent is None:
            raise ValueError("CostNetShardEstimator needs a DreamShard agent (agent=...)")
        self._topology = topology
        self._agent = agent
        self._batch_size = batch_size
        self._spec_fn: SpecFn = spec_fn or spec_for_option
        self._policy_table = policy_table or (lambda name: False)
        self._fallback: ShardEstimator = EmbeddingPerfEstimatorFactory.create(
            DEFAULT_PERF_ESTIMATOR, topology=topology, constraints=constraints
        )

    def estimate(
        self, sharding_options: list[ShardingOption], sharder_data_map: SharderDataMap
    ) -> None:
        """Set ``shard.perf`` of every option in place."""
        ours = [o for o in sharding_options if self._ours(o)]
        others = [o for o in sharding_options if not self._ours(o)]
        if others:
            self._fallback.estimate(others, sharder_data_map=sharder_data_map)
        if not ours:
            return
        specs = _unique_specs([self._spec_fn(o) for o in ours])
        task = prediction_task(specs, self._topology.world_size, self._batch_size)
        costs = self._agent.table_costs(task)  # each table alone on one device
        row = {t.name: i for i, t in enumerate(specs)}
        for option in ours:
            cost = float(costs[row[option.fqn]]) / len(option.shards)
            for shard in option.shards:
                # a table is rated as a whole, shared evenly by its shards
                shard.perf = Perf(fwd_compute=cost, fwd_comms=0.0, bwd_compute=0.0, bwd_comms=0.0)

    def _ours(self, option: ShardingOption) -> bool:
        """Every option of a policy table: TorchRec's estimator takes minutes at scale."""
        return is_dreamshard_option(option) or self._policy_table(option.name)


def _unique_specs(specs: Sequence[TableSpec]) -> list[TableSpec]:
    seen: dict[str, TableSpec] = {}
    for s in specs:
        seen.setdefault(s.name, s)
    return list(seen.values())
