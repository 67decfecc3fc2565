"""The two steps of ``DreamShardPlanner.plan`` that measure, within one budget: the
machine profile before TorchRec's loop and the verification after it; the loop runs
behind the measuring gate."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from torchrec.distributed.planner.types import ParameterConstraints, Topology

from torchrec_dreamshard.cache.location import checked_cache_dir, using_cache_dir
from torchrec_dreamshard.cost.storage_correction import StorageCorrection
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure.gate import no_measuring
from torchrec_dreamshard.planner.steps.plan_agent import AdaptSettings
from torchrec_dreamshard.planner.steps.profile_step import (
    MachineSources,
    PlanInputs,
    ProfileNeeds,
    ProfileStep,
    given_profile,
    plan_budget,
)
from torchrec_dreamshard.planner.steps.verify_step import (
    LoopChoice,
    Verdict,
    skipped,
    unmeasured,
    verify_choice,
)
from torchrec_dreamshard.planner.type_choice.model_needs import (
    offers_priced_types,
    sharding_paths_may_change,
)
from torchrec_dreamshard.policy.protocol import PlacementAgent
from torchrec_dreamshard.profile.budget import Budget
from torchrec_dreamshard.profile.machine_profile import MachineProfile

T = TypeVar("T")


@dataclass(frozen=True)
class StepSettings:
    """What the measuring steps are built with, all at once.

    Attributes:
        topology: the devices planned for.
        profile: the user's profile or its file; with one, nothing is measured.
        measure: ``False``: nothing is measured, the verification is skipped too.
        timeout_seconds: TorchRec's ``timeout_seconds``, the whole plan's budget.
        cache_dir: where the plan's measurements are cached (``None``: the default).
        adapt: how the planner calibrates and verifies.
        candidates: the candidate sources whose plans are measured beside ours.
        storage_correction: the planner's storage correction (``None``: the profile's).
    """

    topology: Topology
    profile: str | Path | MachineProfile | None
    measure: bool
    timeout_seconds: float | None
    cache_dir: str | Path | None
    adapt: AdaptSettings
    candidates: Sequence[Any] = ()
    storage_correction: StorageCorrection | None = None


class MeasuringSteps:
    """The profile step and the verification step of one planner."""

    def __init__(self, settings: StepSettings, sources: MachineSources) -> None:
        self._settings = settings
        self._given = given_profile(settings.profile)
        cache_dir = settings.cache_dir
        self._cache_dir = None if cache_dir is None else checked_cache_dir(cache_dir)
        self._profile_step = ProfileStep(
            settings.topology,
            self._given,
            settings.measure,
            sources,
            settings.adapt,
            settings.candidates,
        )

    @property
    def given(self) -> bool:
        """Whether the user gave the profile (nothing is measured)."""
        return self._given is not None

    def cache_scope(self) -> contextlib.AbstractContextManager[None]:
        """The block a plan runs in: its measurements cached under ``cache_dir``."""
        return using_cache_dir(self._cache_dir)

    def budget(self) -> Budget:
        """A new plan's budget (``timeout_seconds``, or the default plan's)."""
        return Budget(plan_budget(self._settings.timeout_seconds, self._settings.adapt))

    def context(self) -> list[Any]:
        """What the plan depends on besides the agent (part of the planner's context)."""
        stamp = self._given.stamp.to_dict() if self._given is not None else None
        correction = self._settings.storage_correction
        if correction is None and self._given is not None:
            correction = self._given.storage_correction
        return [self._settings.measure, stamp, correction.fingerprint() if correction else None]

    def profile(
        self,
        prior: PlacementAgent,
        inputs: PlanInputs,
        constraints: dict[str, ParameterConstraints] | None,
        budget: Budget,
        task: Callable[[], Task | None],
        loads_plan: bool,
    ) -> MachineProfile:
        """The first step: the machine profile this plan prices with, measured within
        ``budget`` (``task``: the tables calibration would measure)."""
        device = inputs.topology.compute_device
        needs = ProfileNeeds(
            types_offered=offers_priced_types(inputs.sharders, inputs.module, constraints, device),
            paths_may_change=sharding_paths_may_change(
                inputs.sharders, inputs.module, constraints, inputs.topology
            ),
            loads_plan=loads_plan,
        )
        profile = self._profile_step.run(prior, budget, needs, task)
        correction = self._settings.storage_correction
        if correction is not None:  # kept with the profile, for other plans
            profile = dataclasses.replace(profile, storage_correction=correction)
        return profile

    def verify(
        self,
        agent: PlacementAgent,
        profile: MachineProfile,
        choice: LoopChoice | None,
        budget: Budget,
        loads_plan: bool,
        ours_won: bool = True,
    ) -> Verdict:
        """The last step: ``choice`` measured where the planner verifies, within what is
        left of ``budget`` (``ours_won``: the policy's proposal won TorchRec's loop)."""
        adapt = self._settings.adapt
        if self._profile_step.unmeasured(loads_plan) is not None:
            return Verdict()
        settings = adapt.verification(profile.calibration is not None)
        if choice is None:
            why = (
                "a user's proposal won TorchRec's loop"
                if not ours_won
                else "the plan has no whole-table placement of the policy's to verify (it "
                "splits tables column-wise, or moved every table off table-wise)"
            )
            return skipped(f"verification skipped: {why}") if settings.k else Verdict()
        if not settings.k:  # not verified: what the plan was kept on, predicted
            return unmeasured(agent, choice, self._settings.candidates)
        measure = adapt.calibration.measure if adapt.calibration is not None else None
        return verify_choice(agent, choice, settings, budget, self._settings.candidates, measure)

    @staticmethod
    def quietly(loop: Callable[[], T]) -> T:
        """``loop()`` (TorchRec's loop) with every measuring entry point closed."""
        with no_measuring("inside TorchRec's planning loop: measure in the profile step"):
            return loop()
