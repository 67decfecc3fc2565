"""``CostNetPerfModel``: rates a plan with the DreamShard cost network.

For the table-wise tables DreamShard placed, and the column-wise shards of those it split
(each shard a table of its columns), the cost network predicts each rank's fused
forward, backward and communication time and the overall step cost. Shards TorchRec placed
(tables DreamShard leaves to it) add TorchRec's own perf estimate to their rank. The rating
is the cost network's step cost, penalised by its uncertainty as the safety net penalises
its candidates (``PlanPrediction.score_ms``), plus the largest per-rank TorchRec estimate:
every proposal, DreamShard's or a user proposer's, is rated the same way.

Why the other shards keep TorchRec's estimate, not their sharding type's cost strategy
(:mod:`torchrec_dreamshard.cost.sharding_types`, which the type choice prices with).
Tried on the planner regression cases (``tests/test_plan_regression_planner.py``): pricing
every other option whose type has a strategy, on the kernel the strategy prices, with
that strategy left all 34 plans and winners as they were but moved the predicted step of
the 12 cases that hold such options by 0.62x to 10x, mostly the strategies' collectives,
which TorchRec's estimates leave out. That is not one cost per sharding type either: the
policy's table-wise tables would keep the cost network's all-to-all beside the strategies'
collectives for the rest, each paying its own latency, and the two added as maxima over
ranks. One cost per type means rating the whole plan with the typed cost model
(:func:`~torchrec_dreamshard.cost.plans.plan_cost`, the cost network pricing its kernels),
and that changed which proposal wins (the ``user_proposer_with_types`` case): a change of
the planner's rating, and of its recorded predictions, to make on purpose, not here.
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
        agent: the DreamShard agent.
        topology: the devices.
        batch_size: the *global* batch the table-wise kernels process.
        spec_fn: turns an option into a :class:`TableSpec` (the enumerator's
            ``table_spec``, which knows measured reuse statistics).
        other_scale: what TorchRec's estimates of the shards TorchRec placed are multiplied
            by (1: as TorchRec estimates; a running job's re-plan sets it to what the job
            measured, :func:`~torchrec_dreamshard.feedback.replan.other_factor`).
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
        """Predicted step cost of ``plan`` in ms, penalised by the cost network's
        uncertainty (lower is better)."""
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
