"""``DreamShardPlanner``: a TorchRec ``EmbeddingShardingPlanner`` whose table-wise
placements come from a trained DreamShard policy.

Usage, in an existing TorchRec training job::

    planner = DreamShardPlanner(topology=topology, batch_size=B, constraints=constraints)
    plan = planner.collective_plan(model, sharders, pg)
    model = DistributedModelParallel(model, device=device, plan=plan)

It is TorchRec's planner, with TorchRec's planning loop and each step where TorchRec has
it: :class:`DreamShardEnumerator` offers the options (sharding types included), rated by
:class:`CostNetShardEstimator` and TorchRec's storage estimator; :class:`DreamShardProposer`
proposes one option per table, the sharding-type choice included;
:class:`DreamShardPartitioner` places the proposal (TorchRec's partitioner the tables the
policy does not place; the policy, splitting some column-wise, its own tables in the memory
left) and checks memory; :class:`CostNetPerfModel` rates every proposal;
:class:`CostNetStats` logs the predicted per-rank times and which proposer won. Which
tables the policy places: :mod:`torchrec_dreamshard.planner.enumerators`. It takes every
argument of TorchRec's planner with TorchRec's meaning; a user's enumerator, proposers,
partitioner, performance model, stats, callbacks and plan loader add to ours or replace
them (see :class:`DreamShardPlanner`). Nothing here trains. When the tables cannot be
placed, TorchRec's planner raises its ``PlannerError`` (``INSUFFICIENT_STORAGE`` when the
model does not fit the devices' memory in all, else ``STRICT_CONSTRAINTS``) with
DreamShard's message, naming the tables and what to change, as its last error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn
from torchrec.distributed.planner.constants import BATCH_SIZE
from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.stats import EmbeddingStats
from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    Partitioner,
    PerfModel,
    PlanLoader,
    PlannerError,
    Proposer,
    ShardingOption,
    Stats,
    StorageReservation,
    Topology,
    hash_sha256_str,
    hash_sha256_to_int,
)
from torchrec.distributed.types import ModuleSharder, ShardingPlan

from torchrec_dreamshard.cost.dense_kernel_model import DenseKernelModel
from torchrec_dreamshard.measure.collectives import CollectiveModels
from torchrec_dreamshard.measure.distributed_job_group import JobGroup, broadcast, driving, serve
from torchrec_dreamshard.measure.spent import spending
from torchrec_dreamshard.planner.candidates import default_sources
from torchrec_dreamshard.planner.defaults import (
    Unloaded,
    check_arguments,
    default_topology,
    load_agent,
    machine_models,
    with_calibration,
)
from torchrec_dreamshard.planner.enumerators import DreamShardEnumerator
from torchrec_dreamshard.planner.option_specs import OptionSpecs
from torchrec_dreamshard.planner.partitioners import DreamShardPartitioner
from torchrec_dreamshard.planner.perf_models import CostNetPerfModel
from torchrec_dreamshard.planner.placement import PolicyPlacer
from torchrec_dreamshard.planner.plan_broadcast import PlanBroadcast
from torchrec_dreamshard.planner.plan_prediction import PlanPrediction
from torchrec_dreamshard.planner.proposers import DreamShardProposer
from torchrec_dreamshard.planner.replanning import Replanning, meta_copy
from torchrec_dreamshard.planner.search_space import plan_layout
from torchrec_dreamshard.planner.stats import CostNetStats
from torchrec_dreamshard.planner.torchrec_adapter import (
    fill_dense_estimate,
    heuristical_reservation,
)
from torchrec_dreamshard.planner.tracked_proposers import tracked
from torchrec_dreamshard.policy.protocol import PlacementAgent

logger = logging.getLogger(__name__)


class DreamShardPlanner(Replanning, EmbeddingShardingPlanner):
    """A TorchRec sharding planner driven by a trained DreamShard policy.

    Every argument of TorchRec's ``EmbeddingShardingPlanner`` comes first, in TorchRec's
    order and with TorchRec's meaning; a user's component adds to DreamShard's or replaces
    it (the README's "TorchRec compatibility" table says which):

    Args:
        topology: the devices (default: the current process group's).
        batch_size: TorchRec's per-rank batch size (default TorchRec's 512). Under
            table-wise sharding each rank's kernels see the global batch, so the policy
            plans for ``batch_size * world_size``.
        enumerator: the search space (default :class:`DreamShardEnumerator`). A user's
            enumerator replaces ours: the policy places the table-wise fused options of
            ``EmbeddingBagCollection`` tables in it (and splits those it also offers
            column-wise), TorchRec's machinery plans the rest from its options.
        storage_reservation: TorchRec storage reservation (default
            ``HeuristicalStorageReservation(heuristical_storage_reservation_percentage)``).
        proposer: one or a list of TorchRec proposers. They add to DreamShard's:
            DreamShard's proposal comes first, then theirs; every proposal that partitions is
            rated by ``performance_model`` and the best kept, as in TorchRec. What a user's
            proposal sets on an option (kernel, cache parameters) is in the plan when it
            wins. :class:`CostNetStats` logs which proposer won.
        partitioner: places what the policy does not (the user proposers' proposals,
            and the other tables of ours) in place of TorchRec's ``GreedyPerfPartitioner``.
        performance_model: rates every proposal (default :class:`CostNetPerfModel`: the
            cost network, penalised by its uncertainty). A user's replaces ours as the
            judge between proposals; the policy still places with the cost network.
        stats: stats loggers (default TorchRec's ``EmbeddingStats``); :class:`CostNetStats`
            is always appended.
        constraints: TorchRec ``ParameterConstraints`` by table name; every field reaches
            the plan as TorchRec passes it.
        debug: TorchRec's per-table stats.
        callbacks: TorchRec plan callbacks, applied to the chosen plan.
        timeout_seconds: TorchRec's planning timeout (the proposers after ours stop
            proposing when it is reached; the policy's one proposal is always made).
        plan_loader: a TorchRec ``PlanLoader``: a plan whose context hash matches
            :meth:`hash_planner_context_inputs_str` is loaded instead of planned; a
            mismatch raises ``PlannerError(PLANNER_INPUT_CONTEXT_MISMATCH)``.
        heuristical_storage_reservation_percentage: the default storage reservation's
            percentage (TorchRec's planner base argument).
        checkpoint: a checkpoint written by ``dreamshard train``; ``None`` uses the one
            bundled with the package (trained on CPU).
        agent: an already loaded agent (overrides ``checkpoint``).
        mode: ``"safe"`` (the default: the policy's roll-outs, the classic heuristics and
            TorchRec's planner compete, refined, chosen by the cost network penalised by
            its uncertainty), ``"greedy"`` (one policy roll-out, milliseconds) or
            ``"search"`` (the policy's roll-outs only, refined).
        num_samples: sampled policy roll-outs (safe and search modes).
        seed: sampling seed.
        sample_batches: optional ``KeyedJaggedTensor`` batches of the model's sparse
            features; each table's reuse histogram is measured from them.
        calibrate: calibrate the cost network here on these tables before placing
            (:mod:`torchrec_dreamshard.calibration`): ``True`` (60 s), a budget in seconds,
            a ``CalibrationConfig``; ``None`` (default) where the checkpoint misprices
            this machine's reference kernel; ``False`` never.
            Under ``collective_plan`` it runs on rank 0's device(s) only.
        verify: measure this many best-rated candidate plans and the heuristics' plans on
            real kernels and keep the fastest heuristic plan unless another beat it in every
            round (0: no verification); ``None`` (default): where ``calibrate=None``
            calibrates, verify two plans within 25 s, cached per machine, and nowhere else.
        collectives: the collective models the sharding-type choice rates plans with
            (default :func:`~torchrec_dreamshard.planner.defaults.default_collectives`).
        dense_kernel: the model of the dense kernel data-parallel tables run, that the
            type choice prices them with (default
            :func:`~torchrec_dreamshard.planner.defaults.default_dense_kernel`).

    The context hash (:meth:`hash_planner_context_inputs_str`) covers TorchRec's inputs and
    what only DreamShard depends on: the agent's weights (:meth:`DreamShard.fingerprint`),
    the mode, samples and seed, the calibration and verification settings and the reuse
    statistics measured from ``sample_batches``.
    """

    def __init__(
        self,
        topology: Topology | None = None,
        batch_size: int | None = None,
        enumerator: Enumerator | None = None,
        storage_reservation: StorageReservation | None = None,
        proposer: Proposer | list[Proposer] | None = None,
        partitioner: Partitioner | None = None,
        performance_model: PerfModel | None = None,
        stats: Stats | list[Stats] | None = None,
        constraints: dict[str, ParameterConstraints] | None = None,
        debug: bool = True,
        callbacks: list[Callable[[list[ShardingOption]], list[ShardingOption]]] | None = None,
        timeout_seconds: int | None = None,
        plan_loader: PlanLoader | None = None,
        heuristical_storage_reservation_percentage: float = 0.15,
        *,
        checkpoint: str | Path | None = None,
        agent: PlacementAgent | None = None,
        mode: str = "safe",
        num_samples: int = 4,
        seed: int = 0,
        sample_batches: Iterable[Any] | None = None,
        calibrate: Any = None,
        verify: int | None = None,
        collectives: CollectiveModels | None = None,
        dense_kernel: DenseKernelModel | None = None,
    ) -> None:
        self._arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        users = check_arguments(
            mode, batch_size, enumerator, proposer, partitioner, performance_model, plan_loader
        )
        topology = topology if topology is not None else default_topology()
        batch_size = batch_size or BATCH_SIZE
        self._load_error: str | None = None
        agent = agent if agent is not None else self._load_agent(checkpoint)
        self.agent: PlacementAgent = with_calibration(agent, topology, calibrate, verify)
        self._settings = [mode, num_samples, seed, repr(calibrate), verify]
        # TorchRec's default reservation, its dense estimate filled in from each model
        self._own_reservation = None
        if storage_reservation is None:
            self._own_reservation = heuristical_reservation(
                None, [], heuristical_storage_reservation_percentage
            )
        reservation = storage_reservation or self._own_reservation
        self.table_specs = OptionSpecs(sample_batches, topology.world_size)
        global_batch, sources = batch_size * topology.world_size, default_sources()
        self.proposer = DreamShardProposer(
            self.agent,
            topology,
            global_batch,
            reservation,
            constraints=constraints,
            spec_fn=self.table_specs,
            sources=sources,
            **machine_models(topology, collectives, dense_kernel),
        )
        proposers, self.proposal_log = tracked([self.proposer, *users])
        placer = PolicyPlacer(self.agent, global_batch, mode, num_samples, seed, sources)
        given = (enumerator, partitioner, performance_model, stats)  # the user's, or None
        super().__init__(
            topology=topology,
            batch_size=batch_size,
            storage_reservation=reservation,
            proposer=proposers,
            constraints=constraints,
            debug=debug,
            callbacks=callbacks,
            timeout_seconds=timeout_seconds,
            plan_loader=plan_loader,
            **self._components(topology, batch_size, reservation, constraints, placer, given),
        )
        self.last_plan: ShardingPlan | None = None
        self._adaptation: dict[str, Any] | None = None

    def _components(self, topology, batch_size, reservation, constraints, placer, given) -> dict:
        """TorchRec's enumerator, partitioner, performance model and stats arguments (ours,
        set as ``partitioner``, ``perf_model``, ``cost_stats``, with the user's ``given``:
        see the class docstring)."""
        enumerator, partitioner, performance_model, stats = given
        enumerator = enumerator or DreamShardEnumerator(
            topology, batch_size, constraints, self.agent, reservation, self.table_specs
        )
        self.partitioner = DreamShardPartitioner(
            partitioner or GreedyPerfPartitioner(), placer, enumerator, self.table_specs
        )
        global_batch = batch_size * topology.world_size
        self.perf_model = CostNetPerfModel(self.agent, topology, global_batch, self.table_specs)
        self.cost_stats = CostNetStats(
            self.perf_model, self.partitioner, self.proposal_log, lambda: self.adaptation
        )
        stats = [EmbeddingStats()] if stats is None else stats
        return {
            "enumerator": enumerator,
            "partitioner": self.partitioner,
            "performance_model": performance_model or self.perf_model,
            "stats": [*(stats if isinstance(stats, list) else [stats]), self.cost_stats],
        }

    def _load_agent(self, checkpoint: str | Path | None) -> PlacementAgent:
        """Load the checkpoint. Under a process group of several ranks a failure is kept
        (the planner holds a stand-in agent) and raised by :meth:`collective_plan` on every
        rank at once, so no rank is left waiting for one that failed."""
        try:
            return load_agent(checkpoint)
        except ValueError as exc:
            if not (dist.is_initialized() and dist.get_world_size() > 1):
                raise
            self._load_error = f"rank {dist.get_rank()}: {exc}"
            return Unloaded(self._load_error)

    def plan(self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]]) -> ShardingPlan:
        """TorchRec's ``plan`` (this rank only), with the tables' reuse statistics measured
        from ``sample_batches`` first; raises a checkpoint failure kept by ``__init__``."""
        if self._load_error is not None:
            raise ValueError(self._load_error)
        self._adaptation = None
        self.proposal_log.reset()
        self.cost_stats.last_prediction = None
        self.last_plan = None
        with spending() as self._spent:
            self.table_specs.observe(module)
            self._recall_inputs(module)
            if self._own_reservation is not None:
                fill_dense_estimate(self._own_reservation, module, sharders)
            plan = super().plan(module, sharders)
        self.last_plan = plan
        return plan

    def collective_plan(
        self,
        module: nn.Module,
        sharders: list[ModuleSharder[nn.Module]] | None = None,
        pg: dist.ProcessGroup | None = None,
    ) -> ShardingPlan:
        """Plan on rank 0 and broadcast the plan, with failures reaching every rank.

        First every rank shares whether its checkpoint loaded (one small
        ``all_gather_object``): if any failed, every rank raises the same ``ValueError``
        naming the ranks and the reasons. Then rank 0 plans and broadcasts a
        :class:`PlanBroadcast`: the plan and the cost network's prediction of it (so
        :attr:`last_placement`, :attr:`last_shards`, :attr:`last_prediction` and
        :attr:`adaptation` are set on every rank), or its error, which every other rank
        raises as well (a ``PlannerError`` with the same ``error_type``).

        While rank 0 plans, the other ranks serve its measurements
        (:mod:`torchrec_dreamshard.measure.distributed_job_group`): whatever the plan
        needs measured on this machine and not yet cached (the collectives, the dense and
        reference kernels, calibration kernels) is measured on ``pg`` itself, every rank
        taking part, and no process is spawned.
        """
        from torchrec.distributed.sharding_plan import get_default_sharders

        if pg is None:
            if not dist.is_initialized():
                raise ValueError(
                    "collective_plan needs an initialised process group; use plan() on one rank"
                )
            pg = dist.GroupMember.WORLD
        sharders = get_default_sharders() if sharders is None else sharders
        statuses: list[str | None] = [None] * dist.get_world_size(pg)
        dist.all_gather_object(statuses, self._load_error, group=pg)
        failures = [s for s in statuses if s]
        if failures:
            raise ValueError("; ".join(failures))
        group = JobGroup.of(pg)
        if group.rank == 0:
            with driving(group):
                sent = self._plan_for_broadcast(module, sharders)
            broadcast(group, sent)
        else:
            logger.info("rank %d: measuring for rank 0 until it has planned", group.rank)
            sent = serve(group)
        assert isinstance(sent, PlanBroadcast)
        self._adaptation = sent.adaptation
        if sent.plan is None:
            raise sent.error()
        self.last_plan = sent.plan
        self.cost_stats.last_prediction = sent.prediction
        return sent.plan

    def _plan_for_broadcast(self, module: nn.Module, sharders: list) -> PlanBroadcast:
        try:
            plan = self.plan(module, sharders)
        except Exception as exc:  # every rank raises it after the broadcast
            kind = exc.error_type.name if isinstance(exc, PlannerError) else None
            return PlanBroadcast(
                None, None, type(exc).__name__, str(exc), kind, adaptation=self.adaptation
            )
        # what a re-plan of this job plans again, once DMP has sharded the model in place
        self._planned = (meta_copy(module), list(sharders))
        return PlanBroadcast(plan, self.last_prediction, adaptation=self.adaptation)

    # -- TorchRec's plan-context hash, with what DreamShard depends on -------------------

    def dreamshard_context(self) -> list[Any]:
        """What only DreamShard's plans depend on: the agent's fingerprint, the mode,
        samples, seed, calibration and verification settings, and the measured reuse."""
        return [self.agent.fingerprint(), *self._settings, self.table_specs.reuse_key()]

    def hash_planner_context_inputs(self) -> int:
        """TorchRec's context hash (topology, batch, search space, storage reservation,
        constraints) combined with :meth:`dreamshard_context`."""
        return hash_sha256_to_int(
            [super().hash_planner_context_inputs(), self.dreamshard_context()]
        )

    def hash_planner_context_inputs_str(self) -> str:
        """The string form of :meth:`hash_planner_context_inputs` (what a ``PlanLoader``
        stores and TorchRec compares before loading a plan)."""
        return hash_sha256_str(
            [super().hash_planner_context_inputs_str(), self.dreamshard_context()]
        )

    # -- what the last plan was -----------------------------------------------------------

    @property
    def last_prediction(self) -> PlanPrediction | None:
        """The cost network's per-rank prediction of the last plan (``None`` before)."""
        return self.cost_stats.last_prediction

    @property
    def last_placement(self) -> dict[str, int]:
        """Rank of every table the last plan shards table-wise on the fused kernel, by fully
        qualified name (``"module.path.table"``)."""
        return plan_layout(self.last_plan)[0] if self.last_plan is not None else {}

    @property
    def last_shards(self) -> dict[str, list[dict]]:
        """The column-wise shards on the fused kernel of every table the last plan splits,
        by fully qualified name: ``[{"device": rank, "columns": [start, end]}, ...]``."""
        return plan_layout(self.last_plan)[1] if self.last_plan is not None else {}
