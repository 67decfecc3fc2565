"""What a planner hands the job it planned: :class:`PlanRecord`, the plan and what it was
planned from (all the feedback loop reads), and :class:`PlannerFactory`, which builds a
planner like the one that planned."""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import ParameterConstraints, ShardingOption, Topology
from torchrec.distributed.types import ShardingPlan

from torchrec_dreamshard.planner.plans.plan_prediction import PlanPrediction
from torchrec_dreamshard.planner.stages.option_specs import OptionSpecs
from torchrec_dreamshard.policy.protocol import PlacementAgent

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.calibration import CalibrationConfig

logger = logging.getLogger("torchrec_dreamshard.planner")

# the planner's arguments that hold a user's component instances (TorchRec's types)
USER_COMPONENTS = (
    "enumerator",
    "storage_reservation",
    "proposer",
    "partitioner",
    "performance_model",
    "stats",
    "callbacks",
    "plan_loader",
)


def meta_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with its parameters and buffers on the meta device."""
    memo: dict[int, Any] = {}
    for p in module.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(module, memo)


@dataclass(frozen=True)
class PlannerFactory:
    """Builds a planner of the arguments a planner was built with, planning with a given agent
    as it is (no calibration, no verification).

    The user's components (:data:`USER_COMPONENTS`) are deep-copied for each planner
    built; one that cannot be copied is shared, with a warning.

    Attributes:
        planner_class: the class of the planner that planned.
        arguments: its constructor's arguments, by name.
    """

    planner_class: type
    arguments: Mapping[str, Any]

    def __call__(self, agent: PlacementAgent, **overrides: Any) -> EmbeddingShardingPlanner:
        """A planner that plans with ``agent`` as it is; ``overrides`` replace arguments."""
        arguments = {k: v for k, v in self.arguments.items() if k != "checkpoint"}
        for name in USER_COMPONENTS:
            if arguments.get(name) is not None and name not in overrides:
                arguments[name] = _fresh(name, arguments[name])
        arguments.update(overrides)
        arguments.update(agent=agent, calibrate=False, verify=0)
        return self.planner_class(**arguments)


def _fresh(name: str, component: Any) -> Any:
    """A deep copy of ``component``, or itself with a warning where it cannot be copied."""
    try:
        return copy.deepcopy(component)
    except Exception as exc:  # noqa: BLE001 - any copy failure: share it, and say so
        logger.warning(
            "re-planning shares the planner's %s (%s): it could not be copied (%s: %s), "
            "so the re-plan changes its state",
            name,
            type(component).__name__,
            type(exc).__name__,
            exc,
        )
        return component


@dataclass(frozen=True)
class PlanRecord:
    """A plan and what it was planned from: what the feedback loop reads of the planner.

    Attributes:
        plan: the plan (every rank, after ``collective_plan``).
        prediction: the cost network's per-rank prediction of it.
        options: the plan's sharding options (``None`` on a rank that did not plan).
        topology: the devices planned for.
        batch_size: TorchRec's per-rank batch size.
        constraints: the ``constraints`` the planner was built with.
        prior_agent: the checkpoint's agent.
        agent: the agent as it planned (calibrated, where it calibrated).
        adaptation: how planning adapted to this machine.
        specs: the table spec of every option.
        model: a meta copy of the planned model (``None``: not planned here, or ``plan``).
        sharders: the sharders it was planned with.
        calibration: the calibration settings (the store the job's observations join).
        replanner: builds a planner like this one.
    """

    plan: ShardingPlan
    prediction: PlanPrediction
    options: tuple[ShardingOption, ...] | None
    topology: Topology
    batch_size: int
    constraints: dict[str, ParameterConstraints] | None
    prior_agent: PlacementAgent
    agent: PlacementAgent
    adaptation: dict[str, Any]
    specs: OptionSpecs
    model: nn.Module | None
    sharders: tuple[Any, ...] | None
    calibration: CalibrationConfig
    replanner: PlannerFactory

    @property
    def global_batch(self) -> int:
        """The batch each table-wise kernel processes: per-rank batch x world size."""
        return self.batch_size * self.topology.world_size

    @property
    def best_options(self) -> list[ShardingOption]:
        """The plan's sharding options (on the rank that planned)."""
        if self.options is None:
            raise ValueError("the planner has no plan on this rank (rank 0 plans)")
        return list(self.options)

    @property
    def planned_inputs(self) -> tuple[nn.Module, list]:
        """The model (a meta copy) and sharders of the plan."""
        if self.model is None or self.sharders is None:
            raise ValueError(
                "the planner has no model to plan again on this rank: rank 0 keeps it "
                "when it plans through collective_plan"
            )
        return self.model, list(self.sharders)
