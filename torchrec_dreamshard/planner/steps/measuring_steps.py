"""The two steps of :meth:`DreamShardPlanner.plan` that measure, around TorchRec's loop
(:class:`MeasuringSteps`): the machine profile before it
(:mod:`~torchrec_dreamshard.planner.steps.profile_step`), the verification after it
(:mod:`~torchrec_dreamshard.planner.steps.verify_step`), both within the plan's one budget
(``timeout_seconds``, or :data:`~.profile_step.FIRST_PLAN_BUDGET_S` for a default plan).
TorchRec's loop runs behind the measuring gate
(:func:`~torchrec_dreamshard.measure.gate.no_measuring`): it times nothing."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.types import ShardingPlan

from torchrec_dreamshard.cost.storage_correction import StorageCorrection
from torchrec_dreamshard.measure.cache_location import checked_cache_dir, using_cache_dir
from torchrec_dreamshard.measure.gate import no_measuring
from torchrec_dreamshard.planner.stages.tracked_proposers import ProposalLog
from torchrec_dreamshard.planner.steps.adaptation import plan_adaptation
from torchrec_dreamshard.planner.steps.machine_sources import machine_sources
from torchrec_dreamshard.planner.steps.profile_step import (
    PlanInputs,
    ProfileStep,
    given_profile,
    plan_budget,
    policy_tables,
)
from torchrec_dreamshard.planner.steps.verify_step import verify_after_loop
from torchrec_dreamshard.planner.type_choice.model_needs import (
    offers_priced_types,
    sharding_paths_may_change,
)
from torchrec_dreamshard.policy.protocol import PlacementAgent
from torchrec_dreamshard.profile.budget import Budget
from torchrec_dreamshard.profile.machine_profile import MachineProfile

OURS = "DreamShardProposer"  # our proposer's label in the proposal log


class MeasuringSteps:
    """Runs one plan: profile, TorchRec's loop, verification (and the loop again where
    the verification kept another plan).

    Args:
        topology: the devices planned for.
        profile: the user's profile or its file (``None``: measure, or not); with one,
            nothing is timed, the verification neither.
        measure: ``False``: nothing is measured, the verification is skipped too.
        timeout_seconds: TorchRec's ``timeout_seconds``, the whole plan's budget.
        cache_dir: where the plan's measurements are cached (``None``: the default).

    Attributes:
        sources: the candidate sources whose plans calibration and verification measure
            beside ours (the planner sets them).
        parts: the planner's storage reservation, enumerator and proposer, which name the
            tables calibration measures (the planner sets them).
    """

    def __init__(
        self,
        topology: Topology,
        profile: str | Path | MachineProfile | None,
        measure: bool,
        timeout_seconds: float | None,
        cache_dir: str | Path | None = None,
    ) -> None:
        if not isinstance(measure, bool):
            raise ValueError(f"measure must be True or False, got {measure!r}")
        given = given_profile(profile)
        self.profile_step = ProfileStep(topology, given, measure, machine_sources(topology))
        self._given = given
        self._cache_dir = None if cache_dir is None else checked_cache_dir(cache_dir)
        self._timeout = timeout_seconds
        self._measure = measure
        self.sources: Sequence[Any] = ()
        self.parts: tuple[Any, Any, Any] | None = None
        self.notes: list[str] = []  # what the last plan did not measure, and why
        self.storage_correction: StorageCorrection | None = None  # the planner's, if given

    @property
    def profile(self) -> MachineProfile | None:
        """The profile the last plan planned from."""
        return self.profile_step.last

    def cache_scope(self) -> contextlib.AbstractContextManager[None]:
        """The block a plan runs in: its measurements cached under ``cache_dir``."""
        return using_cache_dir(self._cache_dir)

    @property
    def given(self) -> bool:
        """Whether the user gave the profile (nothing is measured)."""
        return self._given is not None

    def report(self, out: dict[str, Any], spent: dict[str, float] | None) -> dict[str, Any]:
        """The planner's adaptation record ``out`` with what the last plan measured, spent
        and skipped (:func:`~torchrec_dreamshard.planner.steps.adaptation.plan_adaptation`)."""
        return plan_adaptation(out, spent, self.profile, self.notes, self.given)

    def context(self) -> list[Any]:
        """What the plan depends on besides the agent: whether it measures, the given
        profile's stamp and the storage correction's fingerprint (the planner's context
        hash)."""
        stamp = self._given.stamp.to_dict() if self._given is not None else None
        correction = self.storage_correction
        if correction is None and self._given is not None:
            correction = self._given.storage_correction
        return [self._measure, stamp, correction.fingerprint() if correction else None]

    def correction(self) -> StorageCorrection | None:
        """The storage correction the plan applies: the planner's, else its profile's."""
        if self.storage_correction is not None:
            return self.storage_correction
        return self.profile.storage_correction if self.profile is not None else None

    def plan(
        self,
        agent: PlacementAgent,
        inputs: PlanInputs,
        constraints: dict[str, ParameterConstraints] | None,
        loop: Callable[[], ShardingPlan],
        log: ProposalLog,
        loads_plan: bool,
    ) -> ShardingPlan:
        """The plan ``loop`` (TorchRec's loop) returns, between the two measuring steps;
        ``log``: the proposal log (which proposal won); ``loads_plan``: a plan loader is
        given."""
        self.notes = []
        budget = Budget(plan_budget(self._timeout, agent))
        device = inputs.topology.compute_device
        self.profile_step.calibration_sources = self.sources
        self.profile_step.run(
            agent,
            budget,
            offers_priced_types(inputs.sharders, inputs.module, constraints, device),
            lambda: policy_tables(inputs, constraints, self.parts),
            loads_plan=loads_plan,
            paths_may_change=sharding_paths_may_change(
                inputs.sharders, inputs.module, constraints, inputs.topology
            ),
        )
        if self.storage_correction is not None:  # kept with the profile, for other plans
            self.profile_step.last = dataclasses.replace(
                self.profile_step.last, storage_correction=self.storage_correction
            )
        plan = self._loop(loop)
        ours_won = log.winner == OURS
        if self._given is not None:  # a given profile plans with nothing timed
            return plan
        if self.profile_step.unmeasured is not None:  # measure=False, no CUDA here, ...
            return plan
        if self._measure and verify_after_loop(agent, budget, self.sources, ours_won, self.notes):
            log.reset()
            plan = self._loop(loop)
        return plan

    @staticmethod
    def _loop(loop: Callable[[], ShardingPlan]) -> ShardingPlan:
        with no_measuring("inside TorchRec's planning loop: measure in the profile step"):
            return loop()
