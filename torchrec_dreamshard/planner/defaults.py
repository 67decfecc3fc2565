"""The parts of :class:`~torchrec_dreamshard.planner.planners.DreamShardPlanner` built from
its arguments: the topology, the agent (loaded, wrapped for calibration), and the check that
a user's components are of TorchRec's types."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torchrec.distributed.comm import get_local_size
from torchrec.distributed.planner.types import (
    Enumerator,
    Partitioner,
    PerfModel,
    PlanLoader,
    Proposer,
    StorageReservation,
    Topology,
)
from torchrec.distributed.utils import get_device_type

from torchrec_dreamshard.cost.collective_models import (
    CollectiveModels,
    default_collectives_path,
    load_collective_models,
    load_group_collectives,
)
from torchrec_dreamshard.cost.comm_topology import CommTopology, analytic_models
from torchrec_dreamshard.cost.dense_kernel_model import DenseKernelModel, load_dense_kernel_model
from torchrec_dreamshard.cost.sharding_path_model import (
    ShardingPathModel,
    default_sharding_path_path,
    load_sharding_path_model,
)
from torchrec_dreamshard.measure.hardware import cpu_name
from torchrec_dreamshard.measure.reference_speed import load_reference_ms
from torchrec_dreamshard.planner.profile_step import MachineSources
from torchrec_dreamshard.planner.proposers import MachineModels
from torchrec_dreamshard.planner.torchrec_adapter import (
    heuristical_reservation,
    torchrec_topology,
)
from torchrec_dreamshard.policy.agent import PLACEMENT_MODES
from torchrec_dreamshard.policy.protocol import PlacementAgent
from torchrec_dreamshard.profile.machine_profile import MachineProfile
from torchrec_dreamshard.ranks.job_group import active_group
from torchrec_dreamshard.ranks.spawn import skip_measuring


@dataclass(frozen=True)
class DreamShardSettings:
    """The planner's own settings that its plans depend on, besides the agent and the
    tables (what :meth:`DreamShardPlanner.dreamshard_context` hashes).

    Attributes:
        mode: the placement mode.
        num_samples: sampled policy roll-outs.
        seed: sampling seed.
        calibrate: ``repr`` of the ``calibrate`` argument.
        verify: the ``verify`` argument.
    """

    mode: str
    num_samples: int
    seed: int
    calibrate: str
    verify: int | None

    def context(self) -> list[Any]:
        """The settings in the planner's context hash, in its order."""
        return [self.mode, self.num_samples, self.seed, self.calibrate, self.verify]


def default_topology() -> Topology:
    """The current process group's topology, as TorchRec's planner builds it."""
    if not dist.is_initialized():
        raise ValueError(
            "topology=None needs an initialised process group; pass a TorchRec Topology "
            "(TopologyFactory.create_topology, or torchrec_dreamshard.planner."
            "torchrec_adapter.torchrec_topology(world_size, compute_device))"
        )
    return torchrec_topology(
        dist.get_world_size(), get_device_type(), local_world_size=get_local_size()
    )


def own_reservation(
    given: StorageReservation | None, percentage: float
) -> StorageReservation | None:
    """TorchRec's default storage reservation at ``percentage`` where the user gave none
    (its dense estimate is filled in from each model the planner plans), else ``None``."""
    return heuristical_reservation(None, [], percentage) if given is None else None


def load_agent(checkpoint: str | Path | None) -> PlacementAgent:
    """The agent in ``checkpoint`` (``None``: the one bundled with the package)."""
    from torchrec_dreamshard.policy.checkpoint import load_checkpoint

    return load_checkpoint(checkpoint)


def load_or_defer(checkpoint: str | Path | None) -> tuple[PlacementAgent, str | None]:
    """The agent in ``checkpoint`` and ``None``; under a process group of several ranks, a
    failure is kept instead: a stand-in agent (:class:`Unloaded`) and the error, which
    ``collective_plan`` raises on every rank at once, so no rank is left waiting for one
    that failed. Elsewhere it raises."""
    try:
        return load_agent(checkpoint), None
    except ValueError as exc:
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            raise
        error = f"rank {dist.get_rank()}: {exc}"
        return Unloaded(error), error


def check_arguments(
    mode: str,
    batch_size: int | None,
    enumerator: Enumerator | None,
    proposer: Proposer | list[Proposer] | None,
    partitioner: Partitioner | None,
    performance_model: PerfModel | None,
    plan_loader: PlanLoader | None,
) -> list:
    """The user's proposers as a list, after checking the mode and batch size (a
    ``ValueError``) and that each component is of TorchRec's type for its argument (a
    ``TypeError`` naming the argument and what it got)."""
    if mode not in PLACEMENT_MODES:
        raise ValueError(f"mode must be one of {PLACEMENT_MODES}, got {mode!r}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be a positive per-rank batch, got {batch_size}")
    users = [] if proposer is None else list(proposer) if isinstance(proposer, list) else [proposer]
    expected = [
        ("enumerator", enumerator, Enumerator),
        ("partitioner", partitioner, Partitioner),
        ("performance_model", performance_model, PerfModel),
        ("plan_loader", plan_loader, PlanLoader),
        *[("proposer", p, Proposer) for p in users],
    ]
    for arg, value, kind in expected:
        if value is not None and not isinstance(value, kind):
            raise TypeError(
                f"{arg} must be a TorchRec {kind.__name__} (torchrec.distributed.planner."
                f"types.{kind.__name__}), got {type(value).__name__}"
            )
    return users


def with_calibration(
    agent: PlacementAgent, topology: Topology, calibrate: Any, verify: int | None
) -> PlacementAgent:
    """``agent`` wrapped to calibrate and/or verify in ``place``.

    ``calibrate``: ``None`` (the default) calibrates where the checkpoint misprices this
    machine (:mod:`torchrec_dreamshard.calibration.auto`: the reference kernel, within
    :data:`~torchrec_dreamshard.calibration.auto.AUTO_BUDGET_S`); ``False`` never does;
    ``True`` (60 s), a budget in seconds or a ``CalibrationConfig`` always do.
    ``verify``: ``None`` (the default) verifies where the automatic check calibrates
    (:data:`~torchrec_dreamshard.calibration.auto.AUTO_VERIFY_K` plans, cached), and
    nowhere else; a number of plans always does (0: never)."""
    if verify is not None and (
        isinstance(verify, bool) or not isinstance(verify, int) or verify < 0
    ):
        raise ValueError(
            f"verify must be None (automatic) or an integer >= 0 candidate plans, got {verify!r}"
        )
    from torchrec_dreamshard.calibration import CalibratingAgent, CalibrationConfig
    from torchrec_dreamshard.calibration.auto import AUTO_BUDGET_S
    from torchrec_dreamshard.measure.config import MeasureConfig
    from torchrec_dreamshard.policy import DreamShard

    device = "cuda" if topology.compute_device == "cuda" else "cpu"
    auto = None
    if calibrate is None and isinstance(agent, DreamShard):
        auto = default_reference(topology)
        calibrate = CalibrationConfig(
            budget_s=AUTO_BUDGET_S, measure=MeasureConfig(device=device), progress=True
        )
    elif calibrate is None or calibrate is False:
        note = other_hardware(agent, topology) if calibrate is False else None
        if note:
            logging.getLogger("torchrec_dreamshard.planner").warning(note)
        if not verify:
            return agent
        calibrate = None
    elif calibrate is True:
        calibrate = CalibrationConfig(measure=MeasureConfig(device=device))
    elif isinstance(calibrate, int | float):
        calibrate = CalibrationConfig(
            budget_s=float(calibrate), measure=MeasureConfig(device=device)
        )
    elif not isinstance(calibrate, CalibrationConfig):
        raise ValueError(
            "calibrate must be None (automatic), False, True, a budget in seconds or a "
            f"CalibrationConfig, got {calibrate!r}"
        )
    if auto is None and verify is None:
        verify = 0  # automatic verification goes with automatic calibration only
    # what the default does on its own prints no progress bars; what was asked for does
    return CalibratingAgent(agent, calibrate, verify_k=verify, progress=auto is None, auto=auto)


def other_hardware(agent: PlacementAgent, topology: Topology) -> str | None:
    """Why the agent's kernel times may not hold here: it was trained on another CPU than
    the one planning for CPU ranks (``None`` when they match, or cannot be told)."""
    if isinstance(agent, Unloaded) or topology.compute_device != "cpu":
        return None
    if "calibrated" in agent.meta:  # its kernels were fitted on this machine
        return None
    trained = agent.meta.get("hardware", {})
    here = cpu_name()
    if trained.get("device") != "cpu" or trained.get("device_name") in (None, here):
        return None
    return (
        f"the cost network was trained on {trained['device_name']} CPUs and this machine is "
        f"{here}: its kernel times may be far off here (the CPU kernels' speeds differ "
        "between CPU models); pass calibrate=True (or a budget in seconds) to measure this "
        "machine's kernels before planning (calibrate=None, the default, does so where "
        "the checkpoint misprices the reference kernel)"
    )


class Unloaded:
    """Stands in for an agent whose checkpoint failed to load on this rank (a
    ``PlacementAgent`` in form): every use raises the load error, which
    ``collective_plan`` raises first, on every rank."""

    last_report = None
    calibration_enabled = False

    def __init__(self, message: str) -> None:
        self._message = message

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError(self._message)

    place = prepare = predict = table_costs = fingerprint = _fail

    @property
    def meta(self) -> dict[str, Any]:
        return self._fail()

    @property
    def without_measuring(self) -> Unloaded:
        return self._fail()


def machine_models(
    profile: Callable[[], MachineProfile | None],
    collectives: CollectiveModels | None,
    dense_kernel: DenseKernelModel | None,
) -> MachineModels:
    """The type choice's models of this machine, read (never measured) from the plan's
    machine profile (``profile()``, built before TorchRec's loop), except the collectives
    and dense kernel the user gave, which replace the profile's."""

    def current() -> MachineProfile | None:
        return profile()

    def profile_collectives() -> CollectiveModels | None:
        found = current()
        return found.collectives if found is not None else None

    def profile_dense() -> DenseKernelModel | None:
        found = current()
        return found.dense_kernel if found is not None else None

    def profile_reference() -> tuple[float, float] | None:
        found = current()
        return found.reference_ms if found is not None else None

    def profile_path() -> ShardingPathModel | None:
        found = current()
        return found.sharding_path if found is not None else None

    return MachineModels(
        profile_collectives if collectives is None else lambda: collectives,
        profile_dense if dense_kernel is None else lambda: dense_kernel,
        profile_reference,
        profile_path,
    )


def machine_sources(topology: Topology) -> MachineSources:
    """Where the profile step measures this machine's models from: the collectives
    (:func:`default_collectives`), the dense kernel (:func:`default_dense_kernel`), the
    sharding path (:func:`default_sharding_path`) and the reference kernel
    (:func:`default_reference`), each cached per machine."""
    return MachineSources(
        reference=default_reference(topology),
        collectives=default_collectives(topology),
        collectives_source=collectives_source(topology),
        dense_kernel=default_dense_kernel(topology),
        sharding_path=default_sharding_path(topology),
    )


def collectives_source(topology: Topology) -> str:
    """Where :func:`default_collectives` takes the collective models from, in words."""
    group = active_group()
    if group is not None and group.world == topology.world_size:
        return "measured on the job's process group"
    if topology.compute_device != "cpu":
        return "analytic, from the topology's bandwidths (not measured)"
    return "gloo, fitted on ranks that are threads of this process (cached per machine)"


def default_collectives(topology: Topology) -> Callable[[], CollectiveModels]:
    """Where the type choice's collective models come from:

    * while rank 0 of a job drives measurements on the job's group (``collective_plan``)
      of the topology's size: timed on that group, every rank taking part, on its real
      backend and hosts (a second or two, then cached per machine and topology:
      :func:`~torchrec_dreamshard.cost.collective_models.load_group_collectives`);
    * else, on accelerators: analytic models from the topology's intra-host bandwidth
      (unmeasured);
    * else, on CPU ranks outside a distributed job: the gloo models fitted on ranks that
      are threads of this process, so that no process is started (once, about a second,
      then cached: :func:`~torchrec_dreamshard.cost.collective_models.load_collective_models`);
    * else (``plan()`` on one rank of a running job): that cached fit where there is
      one, the analytic models where not, since nothing but the job's group measures
      inside a job.
    """

    def load() -> CollectiveModels:
        group = active_group()
        if group is not None and group.world == topology.world_size:
            return load_group_collectives(group)
        analytic = analytic_models(CommTopology.from_torchrec(topology))
        if topology.compute_device != "cpu":
            return analytic
        if skip_measuring(default_collectives_path("gloo"), "pricing collectives analytically"):
            return analytic
        return load_collective_models(backend="gloo")

    return load


def default_dense_kernel(topology: Topology) -> Callable[[], DenseKernelModel | None]:
    """Where the type choice's model of the data-parallel (dense) kernel comes from: on CPU
    ranks, FBGEMM's dense kernel timed on this machine (once, a few seconds, then cached:
    :func:`~torchrec_dreamshard.cost.dense_kernel_model.load_dense_kernel_model`); on GPUs,
    timed on this machine's GPU where there is one (unmeasured here); else ``None``
    (analytic: the fused kernel plus dense passes at memory bandwidth)."""
    import torch

    if topology.compute_device == "cpu":
        return lambda: load_dense_kernel_model(device="cpu")
    if topology.compute_device == "cuda" and torch.cuda.is_available():
        return lambda: load_dense_kernel_model(device="cuda")
    return lambda: None


def default_reference(topology: Topology) -> Callable[[], tuple[float, float] | None]:
    """Where the type choice's reference-kernel time comes from: measured on this machine's
    CPU (once, a second or two, then cached:
    :func:`~torchrec_dreamshard.measure.reference_speed.load_reference_ms`) when planning
    for CPU ranks, on its GPU for GPU ranks where there is one (unmeasured here); else
    ``None`` (the cost network's kernels as predicted)."""
    import torch

    if topology.compute_device == "cpu":
        return lambda: load_reference_ms(device="cpu")
    if topology.compute_device == "cuda" and torch.cuda.is_available():
        return lambda: load_reference_ms(device="cuda")
    return lambda: None


def default_sharding_path(
    topology: Topology,
) -> Callable[[bool], ShardingPathModel | None]:
    """Where the type choice's cost of a sharding path comes from, as
    ``load(may_measure)``: on CPU ranks, this machine's cached fit, else (where
    ``may_measure``) timed on 2 gloo ranks this machine starts (once, about 6 s, then
    cached: :func:`~torchrec_dreamshard.cost.sharding_path_model.load_sharding_path_model`);
    inside a running job, only a cached fit (nothing is spawned there); on GPUs ``None``:
    not timed there yet, so no path cost is charged."""

    def load(may_measure: bool = True) -> ShardingPathModel | None:
        if topology.compute_device != "cpu":
            return None
        cached = default_sharding_path_path("cpu")
        if skip_measuring(cached, "charging no sharding-path cost"):
            return None
        if not may_measure and not cached.exists():
            return None
        return load_sharding_path_model(device="cpu")

    return load
