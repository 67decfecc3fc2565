"""``DreamShardPlanner``: a TorchRec ``EmbeddingShardingPlanner`` whose table-wise
placements come from a trained DreamShard policy.

Usage, in an existing TorchRec training job::

    planner = DreamShardPlanner(topology=topology, batch_size=B, constraints=constraints)
    plan = planner.collective_plan(model, sharders, pg)
    model = DistributedModelParallel(model, device=device, plan=plan)

It is wired from TorchRec's own extension points: :class:`DreamShardEnumerator` (with
:class:`CostNetShardEstimator` and TorchRec's storage estimator), :class:`DreamShardProposer`
(runs the policy), :class:`DreamShardPartitioner` (keeps the policy's ranks, checks memory),
:class:`CostNetPerfModel` (rates the plan) and :class:`CostNetStats` (logs the predicted
per-rank times after TorchRec's ``EmbeddingStats``). Nothing here trains.

Which tables the policy places: every ``EmbeddingBagCollection`` table (nested anywhere in
the model, in any number of collections) whose constraints allow table-wise sharding on the
fused kernel and whose table-wise storage fits a device after TorchRec's storage
reservation, or whose constraints also allow column-wise sharding and whose column-wise
shards would fit. Such a table may be split column-wise (:mod:`torchrec_dreamshard.splits`:
when it fits no device whole, or when the cost network predicts a faster step); its shards
are at least ``min_partition`` columns wide (TorchRec's 128 when unset) and the plan gives
it ``column_wise`` with the ranks chosen. The others (constraints forbidding table-wise or
the fused kernel, tables too big for any single device that may not be split, other module
types) are planned by TorchRec's machinery
alongside: TorchRec's enumerator and perf estimator offer their options, the best-rated
option that fits is taken and TorchRec's ``GreedyPerfPartitioner`` places it first; the
policy then places its tables in the memory left. A table too big for any device whose
constraints allow only table-wise sharding is a ``PlannerError`` naming it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torchrec.distributed.comm import get_local_size
from torchrec.distributed.planner.constants import BATCH_SIZE
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.stats import EmbeddingStats
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
from torchrec.distributed.planner.types import (
    ParameterConstraints,
    PlannerError,
    ShardingOption,
    Stats,
    StorageReservation,
    Topology,
)
from torchrec.distributed.utils import get_device_type

from torchrec_dreamshard.planner.enumerators import DreamShardEnumerator
from torchrec_dreamshard.planner.partitioners import DreamShardPartitioner
from torchrec_dreamshard.planner.perf_models import CostNetPerfModel
from torchrec_dreamshard.planner.proposers import DreamShardProposer
from torchrec_dreamshard.planner.stats import CostNetStats
from torchrec_dreamshard.planner.types import PLACEMENT_MODES, PlacementAgent, PlanPrediction

logger = logging.getLogger(__name__)


def default_topology() -> Topology:
    """The current process group's topology, as TorchRec's planner builds it."""
    if not dist.is_initialized():
        raise ValueError(
            "topology=None needs an initialised process group; pass "
            "topology=Topology(world_size=..., compute_device=...)"
        )
    return Topology(
        world_size=dist.get_world_size(),
        compute_device=get_device_type(),
        local_world_size=get_local_size(),
    )


def load_agent(checkpoint: str | Path | None) -> PlacementAgent:
    """The agent in ``checkpoint`` (``None``: the one bundled with the package)."""
    from torchrec_dreamshard.checkpoint import load_checkpoint

    return load_checkpoint(checkpoint)


class DreamShardPlanner(EmbeddingShardingPlanner):
    """A TorchRec sharding planner driven by a trained DreamShard policy.

    Args:
        topology: the devices (default: the current process group's).
        batch_size: TorchRec's per-rank batch size (default TorchRec's 512). Under
            table-wise sharding each rank's kernels see the global batch, so the policy
            plans for ``batch_size * world_size``.
        constraints: TorchRec ``ParameterConstraints`` by table name: pooling factors,
            allowed sharding types and compute kernels.
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
        storage_reservation: TorchRec storage reservation (default
            ``HeuristicalStorageReservation(percentage=0.15)``, TorchRec's default).
        stats: stats loggers (default TorchRec's ``EmbeddingStats`` then
            :class:`CostNetStats`).
        debug: TorchRec's per-table stats.
        callbacks: TorchRec plan callbacks.
        timeout_seconds: TorchRec's planning timeout.
        calibrate: calibrate the cost network on this machine and these tables before
            placing (:mod:`torchrec_dreamshard.calibration`): ``True`` (60 s budget), a
            budget in seconds, or a ``CalibrationConfig``; ``None`` (default) does not.
            Under ``collective_plan`` it runs on rank 0's device(s) only.
        verify: measure this many best-rated candidate plans and the heuristics' plans on
            real kernels and keep the fastest heuristic plan unless another beat it in every
            round (0: no verification).
    """

    def __init__(
        self,
        topology: Topology | None = None,
        batch_size: int | None = None,
        constraints: dict[str, ParameterConstraints] | None = None,
        checkpoint: str | Path | None = None,
        agent: PlacementAgent | None = None,
        mode: str = "safe",
        num_samples: int = 4,
        seed: int = 0,
        sample_batches: Iterable[Any] | None = None,
        storage_reservation: StorageReservation | None = None,
        stats: Stats | list[Stats] | None = None,
        debug: bool = True,
        callbacks: list[Callable[[list[ShardingOption]], list[ShardingOption]]] | None = None,
        timeout_seconds: int | None = None,
        calibrate: Any = None,
        verify: int = 0,
    ) -> None:
        if mode not in PLACEMENT_MODES:
            raise ValueError(f"mode must be one of {PLACEMENT_MODES}, got {mode!r}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be a positive per-rank batch, got {batch_size}")
        topology = topology if topology is not None else default_topology()
        batch_size = batch_size or BATCH_SIZE
        self._load_error: str | None = None
        if agent is None:
            agent = self._load_agent(checkpoint)
        self.agent: PlacementAgent = _with_calibration(agent, topology, calibrate, verify)
        global_batch = batch_size * topology.world_size
        reservation = storage_reservation or HeuristicalStorageReservation(percentage=0.15)
        enumerator = DreamShardEnumerator(
            topology, batch_size, constraints, self.agent, reservation, sample_batches
        )
        self.proposer = DreamShardProposer(
            self.agent, topology, global_batch, reservation, mode, num_samples, seed
        )
        self.perf_model = CostNetPerfModel(
            self.agent, topology, global_batch, spec_fn=enumerator.table_spec
        )
        self.cost_stats = CostNetStats(self.perf_model, self.proposer)
        if stats is None:
            stats = [EmbeddingStats(), self.cost_stats]
        super().__init__(
            topology=topology,
            batch_size=batch_size,
            enumerator=enumerator,
            storage_reservation=reservation,
            proposer=self.proposer,
            partitioner=DreamShardPartitioner(),
            performance_model=self.perf_model,
            stats=stats,
            constraints=constraints,
            debug=debug,
            callbacks=callbacks,
            timeout_seconds=timeout_seconds,
        )

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
            return _Unloaded(self._load_error)

    def plan(self, module: Any, sharders: list[Any]) -> Any:
        """TorchRec's ``plan`` (this rank only); raises a checkpoint failure kept by
        ``__init__``."""
        if self._load_error is not None:
            raise ValueError(self._load_error)
        return super().plan(module, sharders)

    def collective_plan(self, module: Any, sharders: list[Any] | None = None, pg: Any = None):
        """Plan on rank 0 and broadcast the plan, with failures reaching every rank.

        First every rank shares whether its checkpoint loaded (one small
        ``all_gather_object``): if any failed, every rank raises the same ``ValueError``
        naming the ranks and the reasons. Then rank 0 plans and broadcasts either the plan
        with its metadata (:attr:`last_placement`, :attr:`last_prediction`, so they are
        set on every rank) or its error, which every other rank raises as well.
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
        result: list[Any] = [None]
        if dist.get_rank(pg) != 0 and getattr(self.agent, "calibration_enabled", False):
            logger.info(
                "rank %d: waiting for rank 0 to calibrate/verify and plan", dist.get_rank(pg)
            )
        if dist.get_rank(pg) == 0:
            try:
                plan = self.plan(module, sharders)
                result[0] = (
                    "ok",
                    plan,
                    (self.last_placement, self.last_shards),
                    self.last_prediction,
                )
            except Exception as exc:
                result[0] = ("error", type(exc).__name__, str(exc), None)
                dist.broadcast_object_list(result, src=dist.get_global_rank(pg, 0), group=pg)
                raise
        dist.broadcast_object_list(result, src=dist.get_global_rank(pg, 0), group=pg)
        status, first, second, third = result[0]
        if status == "error":
            kind = PlannerError if first == "PlannerError" else ValueError
            if first not in ("PlannerError", "ValueError"):
                kind = RuntimeError
            raise kind(f"rank 0 could not plan: {first}: {second}")
        self.proposer.last_placement = dict(second[0])
        self.proposer.last_shards = dict(second[1])
        self.cost_stats.last_prediction = third
        return first

    @property
    def last_prediction(self) -> PlanPrediction | None:
        """The cost network's per-rank prediction of the last plan (``None`` before)."""
        return self.cost_stats.last_prediction

    @property
    def last_placement(self) -> dict[str, int]:
        """Rank of every whole table the policy placed in the last plan, by fully
        qualified name (``"module.path.table"``)."""
        return dict(self.proposer.last_placement)

    @property
    def last_shards(self) -> dict[str, list[dict]]:
        """The column-wise shards of every table split in the last plan, by fully qualified
        name: ``[{"device": rank, "columns": [start, end]}, ...]``."""
        return dict(self.proposer.last_shards)


def _with_calibration(agent: Any, topology: Topology, calibrate: Any, verify: int) -> Any:
    """``agent`` wrapped to calibrate and/or verify in ``place`` (unchanged without)."""
    if isinstance(verify, bool) or not isinstance(verify, int) or verify < 0:
        raise ValueError(f"verify must be an integer >= 0 candidate plans, got {verify!r}")
    if calibrate is None or calibrate is False:
        if not verify:
            return agent
        calibrate = None
    from torchrec_dreamshard.calibration import CalibratingAgent, CalibrationConfig
    from torchrec_dreamshard.measure.config import MeasureConfig

    device = "cuda" if topology.compute_device == "cuda" else "cpu"
    if calibrate is True:
        calibrate = CalibrationConfig(measure=MeasureConfig(device=device))
    elif isinstance(calibrate, int | float):
        calibrate = CalibrationConfig(
            budget_s=float(calibrate), measure=MeasureConfig(device=device)
        )
    elif calibrate is not None and not isinstance(calibrate, CalibrationConfig):
        raise ValueError(
            "calibrate must be None, True, a budget in seconds or a CalibrationConfig, "
            f"got {calibrate!r}"
        )
    return CalibratingAgent(agent, calibrate, verify_k=verify)


class _Unloaded:
    """Stands in for an agent whose checkpoint failed to load on this rank: any use
    raises the load error (collective_plan raises it first, on every rank)."""

    def __init__(self, message: str) -> None:
        self._message = message

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise ValueError(self._message)
