"""DreamShard's planner components, wired: the user's enumerator, partitioner and
performance model replace ours; the user's proposers and stats add to ours."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.stats import EmbeddingStats
from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    Partitioner,
    PerfModel,
    Proposer,
    Stats,
    StorageReservation,
    Topology,
)

from torchrec_dreamshard.cost.storage_correction import CorrectionSource
from torchrec_dreamshard.planner.plans.loop_result import DeferredStats
from torchrec_dreamshard.planner.stages.enumerators import DreamShardEnumerator
from torchrec_dreamshard.planner.stages.option_specs import OptionSpecs
from torchrec_dreamshard.planner.stages.partitioners import DreamShardPartitioner
from torchrec_dreamshard.planner.stages.perf_models import CostNetPerfModel
from torchrec_dreamshard.planner.stages.placement import PolicyPlacer
from torchrec_dreamshard.planner.stages.proposers import DreamShardProposer, MachineModels
from torchrec_dreamshard.planner.stages.stats import CostNetStats
from torchrec_dreamshard.planner.stages.tracked_proposers import ProposalLog, tracked
from torchrec_dreamshard.policy.protocol import PlacementAgent, PlaceSettings


@dataclass(frozen=True)
class PlanningScope:
    """What every component plans for.

    Attributes:
        agent: the agent (wrapped for calibration where it calibrates).
        topology: the devices.
        batch_size: TorchRec's per-rank batch size.
        reservation: the storage reservation.
        constraints: TorchRec's constraints by table name.
        specs: the table spec of every option.
        storage_correction: factors over TorchRec's storage estimate (``None``: none).
    """

    agent: PlacementAgent
    topology: Topology
    batch_size: int
    reservation: StorageReservation
    constraints: dict[str, ParameterConstraints] | None
    specs: OptionSpecs
    storage_correction: CorrectionSource | None = None

    @property
    def global_batch(self) -> int:
        """Per-rank batch x world size."""
        return self.batch_size * self.topology.world_size


@dataclass(frozen=True)
class UserComponents:
    """The user's components, each ``None`` where not given."""

    enumerator: Enumerator | None = None
    proposers: tuple[Proposer, ...] = ()
    partitioner: Partitioner | None = None
    performance_model: PerfModel | None = None
    stats: Stats | list[Stats] | None = None


@dataclass(frozen=True)
class Components:
    """DreamShard's components, and TorchRec's planner arguments made of them.

    Attributes:
        proposer: DreamShard's proposer.
        proposal_log: which proposer's proposal won.
        partitioner: DreamShard's partitioner.
        perf_model: the cost network's performance model.
        cost_stats: the stats logger of the cost network's predictions.
        loggers: every stats logger (the user's or TorchRec's, then ours).
        deferred: the stats TorchRec's loop calls, holding its call for the planner.
        torchrec: TorchRec's planner arguments made of these components.
    """

    proposer: DreamShardProposer
    proposal_log: ProposalLog
    partitioner: DreamShardPartitioner
    perf_model: CostNetPerfModel
    cost_stats: CostNetStats
    loggers: tuple[Stats, ...]
    deferred: DeferredStats
    torchrec: dict[str, Any]


def build_components(
    scope: PlanningScope,
    how: PlaceSettings,
    user: UserComponents,
    machine: MachineModels,
) -> Components:
    """DreamShard's components for ``scope``, placing with ``how``, with the ``user``'s."""
    agent, topology, specs = scope.agent, scope.topology, scope.specs
    proposer = DreamShardProposer(
        agent,
        topology,
        scope.global_batch,
        scope.reservation,
        constraints=scope.constraints,
        spec_fn=specs,
        machine=machine,
        sources=how.sources,
    )
    proposers, log = tracked([proposer, *user.proposers])
    enumerator = user.enumerator or DreamShardEnumerator(
        topology,
        scope.batch_size,
        scope.constraints,
        agent,
        scope.reservation,
        specs,
        storage_correction=scope.storage_correction,
    )
    placer = PolicyPlacer(agent, scope.global_batch, how)
    partitioner = DreamShardPartitioner(
        user.partitioner or GreedyPerfPartitioner(), placer, enumerator, specs
    )
    perf_model = CostNetPerfModel(agent, topology, scope.global_batch, specs)
    cost_stats = CostNetStats(perf_model)
    stats = [EmbeddingStats()] if user.stats is None else user.stats
    loggers = (*(stats if isinstance(stats, list) else [stats]), cost_stats)
    deferred = DeferredStats()
    torchrec = {
        "enumerator": enumerator,
        "proposer": proposers,
        "partitioner": partitioner,
        "performance_model": user.performance_model or perf_model,
        "stats": [deferred],
    }
    return Components(
        proposer, log, partitioner, perf_model, cost_stats, loggers, deferred, torchrec
    )
