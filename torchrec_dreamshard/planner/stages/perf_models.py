"""``CostNetPerfModel``: rates a plan with the DreamShard cost network.

The cost network prices the policy's tables and split shards; shards TorchRec placed add
TorchRec's own estimate to their rank. Every proposal, ours or a user's, is rated so.
"""

from __future__ import annotations

from collections.abc import Callable

from torchrec.distributed.planner.types import PerfModel, ShardingOption, Topology

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.planner.plans.plan_prediction import PlanPrediction, prediction_task
from torchrec_dreamshard.planner.stages.option_kinds import is_policy_option, is_split_option
from torchrec_dreamshard.planner.stages.option_specs import shard_specs, spec_for_option
from torchrec_dreamshard.policy.protocol import PlacementAgent
from torchrec_dreamshard.policy.safety_net import DEFAULT_PENALTY


class CostNetPerfModel(PerfModel):
    """The cost network as a TorchRec ``PerfModel``.

    Args:
        batch_size: the *global* batch the table-wise kernels process.
        spec_fn: turns an option into a :class:`TableSpec`.
        other_scale: multiplies TorchRec's estimates of the shards TorchRec placed (a
            running job's re-plan sets it from what the job measured).
    """

    def __init__(
        self,
        agent: PlacementAgent,
        topology: Topology,
        batch_size: int,
        spec_fn: Callable[[ShardingOption], TableSpec] | None = None,
        other_scale: float = 1.0,
    ) -> None:
        self._agent = agent
        self._other_scale = other_scale
        self._topology = topology
        self._batch_size = batch_size
        self._spec_fn = spec_fn or spec_for_option
        self._last: tuple[tuple, PlanPrediction] | None = None

    def rate(self, plan: list[ShardingOption]) -> float:
        """Predicted step of ``plan`` in ms, penalised by the network's uncertainty."""
        return self.predict(plan).score_ms

    def predict(self, plan: list[ShardingOption]) -> PlanPrediction:
        """Per-rank predicted times of a partitioned plan (every shard has a rank)."""
        key = tuple((o.fqn, o.sharding_type, tuple(s.rank for s in o.shards)) for o in plan)
        if self._last is None or self._last[0] != key:
            self._last = (key, self._predict(plan))
        return self._last[1]

    def _predict(self, plan: list[ShardingOption]) -> PlanPrediction:
        world = self._topology.world_size
        other = [0.0] * world
        tables = [0] * world
        ours: list[ShardingOption] = []
        for option in plan:
            for rank in {s.rank for s in option.shards}:
                tables[rank] += 1
            if is_policy_option(option) or is_split_option(option):
                ours.append(option)
                continue
            for shard in option.shards:
                if shard.perf is not None:
                    other[shard.rank] += shard.perf.total * self._other_scale
        zeros = [0.0] * world
        if not ours:
            return PlanPrediction(zeros, zeros[:], zeros[:], other, max(other), tables)
        specs, ranks = [], []
        for option in ours:
            specs += shard_specs(option, self._spec_fn(option))
            ranks += [s.rank for s in option.shards]
        task = prediction_task(specs, world, self._batch_size)
        pred = self._agent.predict(task, ranks)
        return PlanPrediction(
            fwd_ms=list(pred.fwd_ms),
            bwd_ms=list(pred.bwd_ms),
            comm_ms=list(pred.comm_ms),
            other_ms=other,
            step_ms=float(pred.step_ms) + max(other),
            tables=tables,
            step_log_std=float(pred.step_log_std),
            penalty=DEFAULT_PENALTY,
        )
