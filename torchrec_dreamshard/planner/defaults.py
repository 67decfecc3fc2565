"""The parts of ``DreamShardPlanner`` built from its arguments: topology, agent, how it
adapts, the check of a user's components, and :func:`wire`."""

from __future__ import annotations

import logging
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

from torchrec_dreamshard.cost.storage_correction import StorageCorrection
from torchrec_dreamshard.measure.hardware import cpu_name
from torchrec_dreamshard.planner.adapters.torchrec_adapter import (
    heuristical_reservation,
    torchrec_topology,
)
from torchrec_dreamshard.planner.components import (
    Components,
    PlanningScope,
    UserComponents,
    build_components,
)
from torchrec_dreamshard.planner.options import DreamShardOptions
from torchrec_dreamshard.planner.stages.candidates import default_sources
from torchrec_dreamshard.planner.stages.option_specs import OptionSpecs
from torchrec_dreamshard.planner.steps.machine_sources import machine_models, machine_sources
from torchrec_dreamshard.planner.steps.measuring_steps import MeasuringSteps, StepSettings
from torchrec_dreamshard.planner.steps.plan_agent import AdaptSettings, PlanAgent
from torchrec_dreamshard.policy.protocol import PlacementAgent, PlaceSettings


def default_topology() -> Topology:
    """The current process group's topology, as TorchRec's planner builds it."""
    if not dist.is_initialized():
        raise ValueError(
            "topology=None needs an initialised process group; pass a TorchRec Topology "
            "(TopologyFactory.create_topology, or torchrec_dreamshard.planner.adapters."
            "topology.torchrec_topology(world_size, compute_device))"
        )
    return torchrec_topology(
        dist.get_world_size(), get_device_type(), local_world_size=get_local_size()
    )


def own_reservation(
    given: StorageReservation | None, percentage: float
) -> StorageReservation | None:
    """TorchRec's default storage reservation at ``percentage`` where the user gave none."""
    return heuristical_reservation(None, [], percentage) if given is None else None


def load_agent(checkpoint: str | Path | None) -> PlacementAgent:
    """The agent in ``checkpoint`` (``None``: the one bundled with the package)."""
    from torchrec_dreamshard.policy.checkpoint import load_checkpoint

    return load_checkpoint(checkpoint)


def load_or_defer(checkpoint: str | Path | None) -> tuple[PlacementAgent, str | None]:
    """The agent in ``checkpoint`` and ``None``; on several ranks a failure is kept (an
    :class:`Unloaded` and the error) for ``collective_plan`` to raise on every rank."""
    try:
        return load_agent(checkpoint), None
    except ValueError as exc:
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            raise
        error = f"rank {dist.get_rank()}: {exc}"
        return Unloaded(error), error


def check_arguments(
    batch_size: int | None,
    enumerator: Enumerator | None,
    proposer: Proposer | list[Proposer] | None,
    partitioner: Partitioner | None,
    performance_model: PerfModel | None,
    plan_loader: PlanLoader | None,
) -> list:
    """The user's proposers as a list, the batch size and the components' types checked.

    Raises:
        ValueError: ``batch_size`` below 1.
        TypeError: a component not of TorchRec's type for its argument (named).
    """
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


def adapt_settings(
    agent: PlacementAgent,
    topology: Topology,
    calibrate: Any,
    verify: int | None,
    verify_rounds: int = 3,
) -> AdaptSettings:
    """The one decoding of ``calibrate`` and ``verify`` (as :class:`DreamShardOptions`
    documents them)."""
    from torchrec_dreamshard.calibration import CalibrationConfig
    from torchrec_dreamshard.calibration.auto import AUTO_BUDGET_S
    from torchrec_dreamshard.measure.config import MeasureConfig
    from torchrec_dreamshard.policy import DreamShard

    device = "cuda" if topology.compute_device == "cuda" else "cpu"
    measure = MeasureConfig(device=device)
    if calibrate is None and isinstance(agent, DreamShard):
        config = CalibrationConfig(budget_s=AUTO_BUDGET_S, measure=measure, progress=True)
        return AdaptSettings(config, automatic=True, verify_k=verify, verify_rounds=verify_rounds)
    if calibrate is None or calibrate is False:
        note = other_hardware(agent, topology) if calibrate is False else None
        if note:
            logging.getLogger("torchrec_dreamshard.planner").warning(note)
        return AdaptSettings(None, verify_k=verify or 0, verify_rounds=verify_rounds)
    if calibrate is True:
        config = CalibrationConfig(measure=measure)
    elif isinstance(calibrate, int | float):
        config = CalibrationConfig(budget_s=float(calibrate), measure=measure)
    else:
        config = calibrate
    return AdaptSettings(config, verify_k=verify or 0, verify_rounds=verify_rounds)


def other_hardware(agent: PlacementAgent, topology: Topology) -> str | None:
    """Why the agent's CPU kernel times may not hold here (``None``: same CPU, or unknown)."""
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
    """Stands in for an agent whose checkpoint failed to load: every use raises the error."""

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


@dataclass(frozen=True)
class Wiring:
    """What a planner is built of: agent, adaptation, specs, steps, components, load error."""

    agent: PlanAgent
    adapt: AdaptSettings
    specs: OptionSpecs
    steps: MeasuringSteps
    parts: Components
    load_error: str | None


def wire(
    options: DreamShardOptions,
    planning: tuple[Topology, int, StorageReservation, dict | None],
    user: UserComponents,
    timeout: float | None,
) -> Wiring:
    """The planner's parts made of ``options`` and the ``user``'s components, for
    ``planning`` (topology, per-rank batch, reservation, constraints)."""
    topology, batch_size, reservation, constraints = planning
    if options.agent is not None:
        prior, load_error = options.agent, None
    else:
        prior, load_error = load_or_defer(options.checkpoint)
    adapt = adapt_settings(
        prior, topology, options.calibrate, options.verify, options.verify_rounds
    )
    specs = OptionSpecs(
        options.sample_batches, topology.world_size, options.reuse_hists, options.bag_length_cvs
    )
    how = PlaceSettings(
        options.mode, options.num_samples, options.seed, default_sources(reserved=True)
    )
    steps = StepSettings(
        topology=topology,
        profile=options.profile,
        measure=options.measure,
        timeout_seconds=timeout,
        cache_dir=options.cache_dir,
        adapt=adapt,
        candidates=how.sources,
        storage_correction=options.storage_correction,
    )
    measuring = MeasuringSteps(steps, machine_sources(topology))
    agent = PlanAgent(prior)

    def correction() -> StorageCorrection | None:
        """The planner's storage correction, else its plan's profile's."""
        profile = agent.profile
        if options.storage_correction is not None or profile is None:
            return options.storage_correction
        return profile.storage_correction

    scope = PlanningScope(agent, topology, batch_size, reservation, constraints, specs, correction)
    machine = machine_models(lambda: agent.profile, options.collectives, options.dense_kernel)
    parts = build_components(scope, how, user, machine)
    return Wiring(agent, adapt, specs, measuring, parts, load_error)
