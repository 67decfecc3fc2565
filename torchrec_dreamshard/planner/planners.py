"""``DreamShardPlanner``: a TorchRec ``EmbeddingShardingPlanner`` whose table-wise
placements come from a trained DreamShard policy.

It is TorchRec's planner, with TorchRec's planning loop and each step where TorchRec has
it (the enumerator, proposer, partitioner, performance model and stats of
:mod:`torchrec_dreamshard.planner.components`), between the two steps that measure
(:mod:`torchrec_dreamshard.planner.steps.measuring_steps`). What the job it planned is handed:
:attr:`DreamShardPlanner.plan_record`. When the tables cannot be placed, TorchRec's planner
raises its ``PlannerError`` with DreamShard's message, naming the tables and what to change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn
from torchrec.distributed.planner.constants import BATCH_SIZE
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    Partitioner,
    PerfModel,
    PlanLoader,
    Proposer,
    ShardingOption,
    Stats,
    StorageReservation,
    Topology,
    hash_sha256_str,
    hash_sha256_to_int,
)
from torchrec.distributed.types import ModuleSharder, ShardingPlan

from torchrec_dreamshard.cost.collective_models import CollectiveModels
from torchrec_dreamshard.cost.dense_kernel_model import DenseKernelModel
from torchrec_dreamshard.cost.storage_correction import StorageCorrection
from torchrec_dreamshard.measure.spent import Spending, spending
from torchrec_dreamshard.planner.adapters.torchrec_adapter import fill_dense_estimate
from torchrec_dreamshard.planner.components import PlanningScope, UserComponents, build_components
from torchrec_dreamshard.planner.defaults import (
    DreamShardSettings,
    check_arguments,
    default_topology,
    load_or_defer,
    own_reservation,
    with_calibration,
)
from torchrec_dreamshard.planner.plans.plan_broadcast import PlanBroadcast, plan_on_rank0
from torchrec_dreamshard.planner.plans.plan_prediction import PlanPrediction
from torchrec_dreamshard.planner.plans.plan_record import PlannerFactory, PlanRecord, meta_copy
from torchrec_dreamshard.planner.stages.candidates import default_sources
from torchrec_dreamshard.planner.stages.option_specs import OptionSpecs
from torchrec_dreamshard.planner.stages.search_space import plan_layout
from torchrec_dreamshard.planner.steps.adaptation import (
    adaptation,
    calibration_config,
    prior_agent,
    recall_inputs,
)
from torchrec_dreamshard.planner.steps.machine_sources import machine_models
from torchrec_dreamshard.planner.steps.measuring_steps import MeasuringSteps
from torchrec_dreamshard.planner.steps.profile_step import PlanInputs
from torchrec_dreamshard.policy.protocol import PlacementAgent, PlaceSettings
from torchrec_dreamshard.profile.machine_profile import MachineProfile
from torchrec_dreamshard.torchrec_compat import best_plan


class DreamShardPlanner(EmbeddingShardingPlanner):
    """A TorchRec sharding planner driven by a trained DreamShard policy.

    Every argument of TorchRec's ``EmbeddingShardingPlanner`` comes first, in TorchRec's
    order and with TorchRec's meaning; a user's component adds to DreamShard's or replaces
    it (the README's "TorchRec compatibility" table says which):

    Args:
        topology: the devices (default: the current process group's).
        batch_size: TorchRec's per-rank batch size (default TorchRec's 512). Under
            table-wise sharding each rank's kernels see the global batch, so the policy
            plans for ``batch_size * world_size``.
        enumerator: the search space (default :class:`DreamShardEnumerator`); a user's
            replaces ours, the policy placing its table-wise fused options of
            ``EmbeddingBagCollection`` tables and TorchRec's machinery the rest.
        storage_reservation: TorchRec storage reservation (default
            ``HeuristicalStorageReservation(heuristical_storage_reservation_percentage)``).
        proposer: one or a list of TorchRec proposers, added to DreamShard's (ours first):
            every proposal is rated by ``performance_model`` and the best kept, with what
            it sets on its options; :class:`CostNetStats` logs which proposer won.
        partitioner: places what the policy does not (the user proposers' proposals,
            and the other tables of ours) in place of TorchRec's ``GreedyPerfPartitioner``.
        performance_model: rates every proposal (default :class:`CostNetPerfModel`); a
            user's replaces ours as the judge, the policy still places with the cost net.
        stats: stats loggers (default TorchRec's ``EmbeddingStats``); :class:`CostNetStats`
            is always appended.
        constraints: TorchRec ``ParameterConstraints`` by table name; every field reaches
            the plan as TorchRec passes it.
        debug: TorchRec's per-table stats.
        callbacks: TorchRec plan callbacks, applied to the chosen plan.
        timeout_seconds: bounds the whole ``plan()``, measuring included (TorchRec's
            proposers after ours stop at it too; the policy's proposal is always made).
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
        calibrate: calibrate the cost network on these tables in the profile step:
            ``True`` (60 s), a budget in seconds, a ``CalibrationConfig``; ``None``
            (default) where the checkpoint misprices this machine's reference kernel;
            ``False`` never.
        verify: after TorchRec's loop, measure this many best-rated candidate plans
            beside the heuristics' and TorchRec's (0: none); ``None`` (default): where
            ``calibrate=None`` calibrated, two plans, cached per machine.
        collectives: the collective models the sharding-type choice rates plans with
            (default :func:`~.steps.machine_sources.default_collectives`).
        dense_kernel: the model of the dense kernel data-parallel tables run, that the
            type choice prices them with (default
            :func:`~torchrec_dreamshard.planner.steps.machine_sources.default_dense_kernel`).
        reuse_hists: each table's reuse histogram (17 fractions of its rows by access
            count, :mod:`torchrec_dreamshard.data.tables`), by fully qualified name
            (``"module.path.table"``), where the sample batches do not measure it: what a
            task file declares.
        bag_length_cvs: each table's bag-length cv (std / mean of ids per sample: bursty
            bags; TorchRec has no field for it), by fully qualified name, where the sample
            batches do not measure it: the bags the kernels the planner measures are fed.
        profile: a ``MachineProfile`` or its file (``dreamshard profile --out``) to plan
            from: nothing is measured before TorchRec's loop, nothing written.
        measure: ``False``: nothing measured at all (the checkpoint's kernels and
            analytic collectives, or the given profile).
        cache_dir: where measurements are cached (default: ``$XDG_CACHE_HOME``'s).
        storage_correction: factors over TorchRec's storage estimate measured in a running
            job (``observer.storage_correction()``), applied to every storage checked
            (default: the given profile's, if it has one).

    Measuring happens in two steps only, around TorchRec's loop, within one budget
    (:mod:`~torchrec_dreamshard.planner.steps.measuring_steps`). The context hash covers
    TorchRec's inputs and what only DreamShard depends on (:meth:`dreamshard_context`).
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
        reuse_hists: Mapping[str, Sequence[float]] | None = None,
        bag_length_cvs: Mapping[str, float] | None = None,
        profile: str | Path | MachineProfile | None = None,
        measure: bool = True,
        cache_dir: str | Path | None = None,
        storage_correction: StorageCorrection | None = None,
    ) -> None:
        arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        self._replanner = PlannerFactory(type(self), arguments)
        self._constraints_given = constraints
        users = check_arguments(
            mode, batch_size, enumerator, proposer, partitioner, performance_model, plan_loader
        )
        topology = topology if topology is not None else default_topology()
        batch_size = batch_size or BATCH_SIZE
        agent, self._load_error = (agent, None) if agent is not None else load_or_defer(checkpoint)
        self.agent: PlacementAgent = with_calibration(agent, topology, calibrate, verify)
        self.settings = DreamShardSettings(mode, num_samples, seed, repr(calibrate), verify)
        self._devices, self._per_rank_batch = topology, batch_size
        # TorchRec's default reservation, its dense estimate filled in from each model
        self._own_reservation = own_reservation(
            storage_reservation, heuristical_storage_reservation_percentage
        )
        reservation = storage_reservation or self._own_reservation
        self._steps = MeasuringSteps(topology, profile, measure, timeout_seconds, cache_dir)
        self.table_specs = OptionSpecs(
            sample_batches, topology.world_size, reuse_hists, bag_length_cvs
        )
        self.storage_correction = self._steps.storage_correction = storage_correction
        scope = PlanningScope(
            self.agent,
            topology,
            batch_size,
            reservation,
            constraints,
            self.table_specs,
            self._steps.correction,
        )
        user = UserComponents(enumerator, tuple(users), partitioner, performance_model, stats)
        how = PlaceSettings(mode, num_samples, seed, default_sources(reserved=True))
        self._steps.sources = how.sources
        parts = build_components(
            scope,
            how,
            user,
            machine_models(lambda: self._steps.profile, collectives, dense_kernel),
            lambda: self.adaptation,
        )
        self._steps.parts = (reservation, parts.torchrec["enumerator"], parts.proposer)
        self.proposer, self.proposal_log = parts.proposer, parts.proposal_log
        self.partitioner, self.perf_model = parts.partitioner, parts.perf_model
        self.cost_stats = parts.cost_stats
        super().__init__(
            topology=topology,
            batch_size=batch_size,
            storage_reservation=reservation,
            constraints=constraints,
            debug=debug,
            callbacks=callbacks,
            timeout_seconds=timeout_seconds,
            plan_loader=plan_loader,
            **parts.torchrec,
        )
        self.last_plan: ShardingPlan | None = None
        self._adaptation: dict[str, Any] | None = None  # as rank 0 sent it
        self._recalled: list[str] = []  # tables whose inputs came from a running job
        self._planned: tuple[nn.Module, list] | None = None  # a re-plan's model, sharders
        self._spent: Spending | None = None  # what the last plan() spent its time on

    def plan(self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]]) -> ShardingPlan:
        """TorchRec's ``plan`` (this rank only) between the two steps that measure
        (:class:`MeasuringSteps`), the tables' reuse statistics measured from
        ``sample_batches`` first; raises a checkpoint failure kept by ``__init__``."""
        if self._load_error is not None:
            raise ValueError(self._load_error)
        self._adaptation = None
        self.proposal_log.reset()
        self.cost_stats.last_prediction = None
        self.last_plan = None
        with self._steps.cache_scope(), spending() as self._spent:
            self.table_specs.observe(module)
            self._recalled = recall_inputs(self.agent, self._devices, self.table_specs, module)
            if self._own_reservation is not None:
                fill_dense_estimate(self._own_reservation, module, sharders)
            plan = self._steps.plan(
                self.agent,
                PlanInputs(module, sharders, self._devices, self._per_rank_batch),
                self._constraints_given,
                lambda: super(DreamShardPlanner, self).plan(module, sharders),
                self.proposal_log,
                loads_plan=self.plan_loader is not None,
            )
        self.last_plan = plan
        return plan

    @property
    def profile(self) -> MachineProfile | None:
        """The machine profile the last plan planned from (``None`` before); ``save`` it
        and hand it to other jobs on the same hardware (``profile=path``)."""
        return self._steps.profile

    def collective_plan(
        self,
        module: nn.Module,
        sharders: list[ModuleSharder[nn.Module]] | None = None,
        pg: dist.ProcessGroup | None = None,
    ) -> ShardingPlan:
        """Plan on rank 0 and send every rank the plan (:attr:`last_placement`,
        :attr:`last_shards`, :attr:`last_prediction` and :attr:`adaptation` set on every
        rank) or rank 0's error, which every rank raises (a ``PlannerError`` of the same
        ``error_type``); a checkpoint that failed on any rank raises a ``ValueError`` on
        every rank. While rank 0 plans, the other ranks serve what it measures, on ``pg``
        itself (:func:`~torchrec_dreamshard.planner.plans.plan_broadcast.plan_on_rank0`)."""
        from torchrec.distributed.sharding_plan import get_default_sharders

        sharders = get_default_sharders() if sharders is None else sharders
        sent = plan_on_rank0(
            self._load_error, lambda: self._plan_for_broadcast(module, sharders), pg
        )
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
            return PlanBroadcast.failure(exc, self.adaptation)
        # what a re-plan of this job plans again, once DMP has sharded the model in place
        self._planned = (meta_copy(module), list(sharders))
        return PlanBroadcast(plan, self.last_prediction, adaptation=self.adaptation)

    # -- TorchRec's plan-context hash, with what DreamShard depends on -------------------
    def dreamshard_context(self) -> list[Any]:
        """What only DreamShard's plans depend on: the agent's fingerprint, the settings,
        the measured reuse, and what the measuring steps plan from
        (:meth:`MeasuringSteps.context`)."""
        reuse = self.table_specs.reuse_key()
        return [self.agent.fingerprint(), *self.settings.context(), reuse, self._steps.context()]

    def hash_planner_context_inputs(self) -> int:
        """TorchRec's context hash combined with :meth:`dreamshard_context`."""
        return hash_sha256_to_int(
            [super().hash_planner_context_inputs(), self.dreamshard_context()]
        )

    def hash_planner_context_inputs_str(self) -> str:
        """:meth:`hash_planner_context_inputs` as TorchRec's ``PlanLoader`` compares it."""
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

    @property
    def adaptation(self) -> dict[str, Any]:
        """How the last plan adapted to this machine (JSON-able, on every rank after
        ``collective_plan``): :func:`~torchrec_dreamshard.planner.steps.adaptation.
        plan_adaptation`."""
        if self._adaptation is not None:
            return self._adaptation
        spent = self._spent.seconds() if self._spent is not None else None
        return self._steps.report(
            adaptation(self.agent, self._recalled, self.proposer.last_types), spent
        )

    @property
    def best_options(self) -> list[ShardingOption]:
        """The sharding options of the last plan (on the rank that planned)."""
        options = best_plan(self)
        if options is None:
            raise ValueError("the planner has no plan on this rank (rank 0 plans)")
        return options

    @property
    def plan_record(self) -> PlanRecord:
        """The last plan and what it was planned from, as a value (:class:`PlanRecord`):
        all the feedback loop reads of the planner (``torchrec_dreamshard.observe(planner,
        dmp)`` observes the job with it). A ``ValueError`` before a plan."""
        if self.last_plan is None or self.last_prediction is None:
            raise ValueError("observe() needs the planner's plan: call collective_plan first")
        options = best_plan(self)
        model, sharders = self._planned if self._planned is not None else (None, None)
        return PlanRecord(
            plan=self.last_plan,
            prediction=self.last_prediction,
            options=tuple(options) if options is not None else None,
            topology=self._devices,
            batch_size=self._per_rank_batch,
            constraints=self._constraints_given,
            prior_agent=prior_agent(self.agent),
            agent=self.agent,
            adaptation=self.adaptation,
            specs=self.table_specs,
            model=model,
            sharders=tuple(sharders) if sharders is not None else None,
            calibration=calibration_config(self.agent, self._devices),
            replanner=self._replanner,
        )
