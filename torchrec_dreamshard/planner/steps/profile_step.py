"""The profile step of ``DreamShardPlanner.plan``: the machine profile built, loaded or
given before TorchRec's loop, as a value."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.types import ModuleSharder

from torchrec_dreamshard.cost.comm_topology import CommTopology, analytic_models
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.planner.steps.plan_agent import AdaptSettings
from torchrec_dreamshard.policy import DreamShard
from torchrec_dreamshard.policy.protocol import PlacementAgent
from torchrec_dreamshard.profile.budget import Budget
from torchrec_dreamshard.profile.build import ProfileRequest, build_profile, unmeasured_profile
from torchrec_dreamshard.profile.machine_profile import MachineProfile
from torchrec_dreamshard.profile.stamp import HARDWARE_FIELDS, SETTING_FIELDS, MachineStamp

logger = logging.getLogger("torchrec_dreamshard.planner")

FIRST_PLAN_BUDGET_S = 25.0  # seconds a default plan may measure (profile and verification)


@dataclass(frozen=True)
class MachineSources:
    """Where the profile step measures the machine's models from.

    Attributes:
        reference: measures (or loads) the reference kernel.
        collectives: measures (or loads) the collective models.
        collectives_source: where those come from, in words.
        dense_kernel: measures (or loads) the dense kernel's model.
        sharding_path: loads a sharding path's cost, measuring it where ``may_measure``.
        cached: the type-choice timings cached for the topology.
    """

    reference: Callable[[], tuple[float, float] | None]
    collectives: Callable[[], Any]
    collectives_source: str
    dense_kernel: Callable[[], Any]
    sharding_path: Callable[[bool], Any] = lambda may_measure: None
    cached: Callable[[], frozenset[str]] = frozenset


def given_profile(profile: str | Path | MachineProfile | None) -> MachineProfile | None:
    """``profile`` loaded where it is a path (a ``ValueError`` naming a bad file)."""
    if profile is None or isinstance(profile, MachineProfile):
        return profile
    if isinstance(profile, str | Path):
        return MachineProfile.load(profile)
    raise ValueError(
        f"profile must be a MachineProfile or the path of a profile file, got {profile!r}"
    )


def _cached_only(load: Callable[[bool], Any]) -> Callable[[bool], Any]:
    """``load`` never measuring, whatever the budget allows."""

    def cached(may_measure: bool) -> Any:
        del may_measure
        return load(False)

    return cached


class ProfileStep:
    """Builds, loads or takes the profile of each plan.

    Args:
        given: the user's profile (``None``: measure or not, as ``measure`` says).
        settings: how the planner adapts (whether and how it calibrates).
        candidates: the candidate sources whose plans calibration measures beside ours.
    """

    def __init__(
        self,
        topology: Topology,
        given: MachineProfile | None,
        measure: bool,
        sources: MachineSources,
        settings: AdaptSettings,
        candidates: Sequence[Any] = (),
    ) -> None:
        self._topology = topology
        self._given = given
        self._measure = measure
        self._sources = sources
        self._settings = settings
        self._candidates = candidates

    def stamp(self) -> MachineStamp:
        t = self._topology
        device = "cuda" if t.compute_device == "cuda" else "cpu"
        return MachineStamp.here(device, t.world_size, t.local_world_size)

    def unmeasured(self, loads_plan: bool) -> str | None:
        """Why a plan measures nothing here (``None``: it may measure)."""
        if self._given is not None:
            return "a machine profile was given: nothing is measured"
        return self._why_not_measured(self.stamp(), loads_plan)

    def run(
        self,
        prior: PlacementAgent,
        budget: Budget,
        needs: ProfileNeeds,
        task: Callable[[], Task | None],
    ) -> MachineProfile:
        """The profile for this plan: the given one; an unmeasured one where nothing may be
        measured (its notes say why); else :func:`build_profile`'s.

        Args:
            prior: the checkpoint's agent.
            task: the tables calibration would measure (asked only where it calibrates).
        """
        stamp = self.stamp()
        if self._given is not None:
            return self._checked(self._given, stamp)
        why = self._why_not_measured(stamp, needs.loads_plan)
        if why is not None:
            analytic = analytic_models(CommTopology.from_torchrec(self._topology))
            source = "analytic, from the topology's bandwidths (not measured)"
            offered = analytic if needs.types_offered else None
            return unmeasured_profile(stamp, why, offered, source)
        path = self._sources.sharding_path
        if not needs.paths_may_change:  # every plan pays the same paths: loaded where cached
            path = _cached_only(path)
        priced = needs.types_offered
        request = ProfileRequest(
            stamp=stamp,
            reference=self._sources.reference,
            collectives=self._sources.collectives if priced else None,
            collectives_source=self._sources.collectives_source,
            dense_kernel=self._sources.dense_kernel if priced else None,
            sharding_path=path if priced else None,
            calibration=self._settings.calibration if isinstance(prior, DreamShard) else None,
            auto=self._settings.automatic,
            task=task,
            sources=self._candidates,
            verifies=lambda calibrates: bool(self._settings.verification(calibrates).k),
            cached=self._sources.cached() if priced else frozenset(),
        )
        return build_profile(prior, request, budget)

    def _why_not_measured(self, stamp: MachineStamp, loads_plan: bool) -> str | None:
        if not self._measure:
            return "measure=False: nothing measured, the checkpoint's kernels as they are"
        if loads_plan:
            return "a plan loader is given: a loaded plan needs no measuring"
        if stamp.device == "cuda" and not torch.cuda.is_available():
            return (
                "a CUDA topology planned on a machine without CUDA: nothing is timed here "
                "as a stand-in; the checkpoint's kernels (or a given profile) price the GPUs"
            )
        return None

    @staticmethod
    def _checked(profile: MachineProfile, here: MachineStamp) -> MachineProfile:
        """``profile`` with notes where it differs from ``here`` (a warning: other hardware)."""
        other = profile.stamp.differences(here, HARDWARE_FIELDS)
        settings = profile.stamp.differences(here, SETTING_FIELDS)
        notes = []
        if other:
            notes.append("the given profile was measured on other hardware: " + "; ".join(other))
            logger.warning(notes[-1])
        if settings:
            notes.append("the given profile was measured for " + "; ".join(settings))
        return profile.with_notes(*notes) if notes else profile


@dataclass(frozen=True)
class ProfileNeeds:
    """Which of the machine's models a plan may price with.

    Attributes:
        types_offered: the search space may offer types the type choice prices.
        paths_may_change: plans may differ in their number of sharding paths.
        loads_plan: a plan loader is given (nothing is measured).
    """

    types_offered: bool
    paths_may_change: bool = True
    loads_plan: bool = False


@dataclass(frozen=True)
class PlanInputs:
    """What one ``plan()`` plans: model, sharders, devices, TorchRec's per-rank batch."""

    module: nn.Module
    sharders: list[ModuleSharder[nn.Module]]
    topology: Topology
    batch_size: int


def plan_budget(timeout_seconds: float | None, settings: AdaptSettings) -> float | None:
    """``timeout_seconds``, else :data:`FIRST_PLAN_BUDGET_S` where the planner adapts by
    default, else none."""
    if timeout_seconds is not None:
        return float(timeout_seconds)
    return FIRST_PLAN_BUDGET_S if settings.automatic else None


def policy_tables(
    inputs: PlanInputs,
    constraints: dict[str, ParameterConstraints] | None,
    parts: tuple[Any, Any, Any],
) -> Task | None:
    """The tables the policy would place, ``parts`` (reservation, enumerator, proposer) run
    as TorchRec's loop runs them."""
    reservation, enumerator, proposer = parts
    reservation.reserve(
        topology=inputs.topology,
        batch_size=inputs.batch_size,
        module=inputs.module,
        sharders=inputs.sharders,
        constraints=constraints,
    )
    search_space = enumerator.enumerate(module=inputs.module, sharders=inputs.sharders)
    return proposer.policy_task(search_space)
