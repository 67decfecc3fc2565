"""The parts of :class:`~torchrec_dreamshard.planner.planners.DreamShardPlanner` built from
its arguments: the topology, the agent (loaded, wrapped for calibration), and the check that
a user's components are of TorchRec's types."""

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

from torchrec_dreamshard.measure.hardware import cpu_name
from torchrec_dreamshard.planner.adapters.torchrec_adapter import (
    heuristical_reservation,
    torchrec_topology,
)
from torchrec_dreamshard.planner.steps.machine_sources import default_reference
from torchrec_dreamshard.policy.agent import PLACEMENT_MODES
from torchrec_dreamshard.policy.protocol import PlacementAgent


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
