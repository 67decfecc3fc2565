"""``JobObserver``: the running DMP job as the planner's measurement: sampled steps, reports
of predicted against measured cost, and re-plans with what was learnt (``docs/feedback.md``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from torchrec_dreamshard.cost.storage_correction import StorageCorrection
from torchrec_dreamshard.feedback.gathering import gather, observed_inputs
from torchrec_dreamshard.feedback.inputs import embedding_tables
from torchrec_dreamshard.feedback.memory_report import (
    MARGIN,
    build_memory_report,
    corrected_report,
    near_cap_warning,
    option_estimates,
    reserved_share,
)
from torchrec_dreamshard.feedback.observed_job_report import build_report, rank_tables, report_lines
from torchrec_dreamshard.feedback.plan_match import check_observed_plan
from torchrec_dreamshard.feedback.profiling import StepProfile
from torchrec_dreamshard.feedback.sampling import EVERY, MAX_OVERHEAD, WARMUP, StepSampler
from torchrec_dreamshard.planner.plans.plan_record import PlanRecord
from torchrec_dreamshard.ranks.job_group import JobGroup, broadcast, driving, serve

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec.distributed.types import ShardingPlan

    from torchrec_dreamshard.planner.planners import DreamShardPlanner

logger = logging.getLogger("torchrec_dreamshard.feedback")


class JobObserver:
    """Observes a DMP job planned as ``record`` says.

    Args:
        record: ``planner.plan_record`` after the planner's ``collective_plan``.
        dmp: the job's ``DistributedModelParallel``, built from ``record.plan``.
        pg: the job's process group (default: the world).
        every: sample at most one step in ``every``.
        warmup: steps before the first sample.
        max_overhead: the share of the job's time sampling may cost (``None``: no limit).
        margin: warn of a rank whose memory peak is within this share of its capacity.

    Raises:
        ValueError: ``dmp`` was built from another plan than ``record.plan``.
    """

    def __init__(
        self,
        record: PlanRecord,
        dmp: Any,
        pg: Any = None,
        every: int = EVERY,
        warmup: int = WARMUP,
        max_overhead: float | None = MAX_OVERHEAD,
        margin: float = MARGIN,
    ) -> None:
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {margin!r}")
        check_observed_plan(record.plan, dmp)
        self.record = record
        self._dmp = dmp
        self._group = JobGroup.of(pg if pg is not None else dist.GroupMember.WORLD)
        self.plan = record.plan  # the observed plan
        self.prediction = record.prediction  # as planned
        self.proposed: Any = None  # the last replan()'s plan, as the updated model predicts it
        self.model = "checkpoint"
        self.last_replan: dict[str, Any] | None = None
        # the model's tables and their features, known where the model was planned (rank 0)
        self._tables = embedding_tables(record.model) if record.model is not None else None
        self.sampler = StepSampler(self._group, dmp, every, warmup, max_overhead)
        self.sampler.memory.attach(dmp, record.plan)
        self.margin = margin
        # the correction the observed plan was made with, and the one learnt from the job
        arguments = getattr(getattr(record, "replanner", None), "arguments", {})
        self.planned_correction: StorageCorrection | None = arguments.get("storage_correction")
        self.learned_correction: StorageCorrection | None = None
        self._options = getattr(record, "options", None)  # the observed plan's options (rank 0)
        self._replanned: list[Any] | None = None  # the last replan()'s options (rank 0)
        self._replanned_plan = ""  # and its plan, as text (every rank)

    def step(self) -> None:
        """Call once after every training step."""
        self.sampler.step()

    @property
    def steps(self) -> int:
        """Training steps observed."""
        return self.sampler.steps

    @property
    def interval(self) -> int:
        """Steps between samples now."""
        return self.sampler.interval

    @property
    def dropped(self) -> int:
        """Samples that spanned a pause, dropped."""
        return self.sampler.dropped

    @property
    def sampling(self) -> bool:
        """Whether a sample is open (the step now running is sampled)."""
        return self.sampler.sampling

    @property
    def sampling_ms(self) -> float:
        """What sampling has cost so far on this rank, in ms."""
        return self.sampler.sampling_ms

    @property
    def overhead(self) -> float:
        """The share of the job's time that sampling cost so far, on this rank."""
        return self.sampler.overhead

    @property
    def profiles(self) -> list[StepProfile]:
        """This rank's sampled steps, read from their profiler events now."""
        return self.sampler.profiles

    def close(self) -> None:
        """Drop a sample still open (also done by :meth:`report`, :meth:`replan` and at exit)."""
        self.sampler.close()

    def _estimates(self) -> list[dict[str, Any]] | None:
        """The observed plan's storage estimate per shard (rank 0, which planned)."""
        from torchrec_dreamshard.planner.adapters.device_memory import memory_tier

        if self._options is None:
            return None
        tier = memory_tier(self.record.topology)
        world = self.record.topology.world_size
        return option_estimates(self._options, tier, world, self.planned_correction)

    def memory_report(self, gathered: dict[str, list[Any]]) -> dict[str, Any] | None:
        """Predicted against measured memory from :func:`gather`'s result (``None`` where
        the plan's estimates are unknown), with the learnt correction's after :meth:`replan`."""
        from torchrec_dreamshard.planner.adapters.device_memory import device_capacity

        estimates = gathered["estimates"][0]
        if estimates is None:
            return None
        caps = device_capacity(self.record.topology)
        report = build_memory_report(
            estimates, gathered["memory"], caps, reserved_share(self.record), self.margin
        )
        if self.learned_correction is not None:
            corrected = corrected_report(report, self.learned_correction)
            report["after_learning"] = {
                "worst_error": corrected["worst_error"],
                "ranks": [
                    {k: r[k] for k in ("rank", "predicted", "measured", "error", "off")}
                    for r in corrected["ranks"]
                ],
                "correction": self.learned_correction.to_dict(),
            }
        return report

    def storage_correction(self) -> StorageCorrection | None:
        """The correction of TorchRec's storage estimate the last :meth:`replan` learnt
        (for ``DreamShardPlanner(storage_correction=...)``); ``None`` before."""
        return self.learned_correction

    def report(self) -> dict[str, Any]:
        """Every rank's predicted and measured embedding cost and memory (collective; the
        same dict on every rank)."""
        gathered = gather(self.sampler, self._group, self._tables, estimates=self._estimates())
        profiles, overheads = gathered["profiles"], gathered["overhead"]
        tables = rank_tables(self.plan, self._group.world)
        report = build_report(profiles, self.prediction, tables, self.model)
        report["observer"] = {
            "interval": self.interval,
            "steps": self.steps,
            "overhead": max(overheads),
            "overhead_by_rank": overheads,
            "sampled_steps": self.sampler.sampled_steps,
        }
        inputs = observed_inputs(gathered, self.record.constraints)
        if inputs is not None:
            report["inputs"] = inputs.to_dict()
        if self.last_replan is not None:
            report["replan"] = self.last_replan
        memory = self.memory_report(gathered)
        if memory is not None:
            report["memory"] = memory
            for rank in memory["near_cap"]:
                logger.warning(near_cap_warning(memory["ranks"][rank], self.margin))
        for line in report_lines(report):
            logger.info(line)
        return report

    def replan(self) -> ShardingPlan:
        """Learn from the observed steps and plan again (collective).

        Returns:
            A new plan where it is predicted to pay beyond the model's uncertainty, else
            the observed plan itself. The updated network prices reports from now on.

        Raises:
            ValueError: no step was sampled yet.
            RuntimeError: rank 0 could not re-plan.
        """
        from torchrec_dreamshard.feedback.observed_job_report import measured_by_rank
        from torchrec_dreamshard.feedback.replan import replan_on_rank0

        gathered = gather(
            self.sampler, self._group, self._tables, with_inputs=True, estimates=self._estimates()
        )
        profiles = gathered["profiles"]
        if min(len(p) for p in profiles) == 0:
            raise ValueError(
                f"replan() needs sampled steps: {self.steps} steps observed, the first "
                f"sample after {self.sampler.warmup} and then one in {self.interval}"
            )
        if self._group.rank == 0:
            with driving(self._group):
                measured = measured_by_rank(profiles)
                inputs = observed_inputs(gathered, self.record.constraints)
                memory = self.memory_report(gathered)
                sent = replan_on_rank0(self.record, measured, inputs, memory)
                if not isinstance(sent, str):
                    sent, self._replanned = sent[:4], sent[4]
            broadcast(self._group, sent)
        else:
            sent = serve(self._group)
        if isinstance(sent, str):
            raise RuntimeError(f"rank 0 could not re-plan: {sent}")
        plan, self.prediction, self.proposed, self.last_replan = sent
        self._replanned_plan = str(plan)
        self.model = "updated"
        learned = self.last_replan.get("storage_correction")
        if learned is not None:
            self.learned_correction = StorageCorrection.from_dict(learned)
        if not self.last_replan.get("changed"):
            plan = self.plan  # the observed plan itself, on every rank: `new is not plan`
        return plan

    def apply_in_place(self, plan: ShardingPlan) -> list[str]:
        """Move ``plan``'s table-wise rank changes into the running job (collective;
        :func:`~torchrec_dreamshard.feedback.reshard.apply_in_place`) and observe the new plan.

        Returns:
            The moved tables.

        Raises:
            ValueError: the plan changes more than table-wise ranks (restart instead).
        """
        from torchrec_dreamshard.feedback.reshard import apply_in_place

        moved = apply_in_place(self._dmp, plan)
        self.sampler.inputs.attach(self._dmp)  # modules a reshard rebuilt
        self.sampler.memory.attach(self._dmp, plan)
        if moved:
            self.plan, self.prediction = plan, self.proposed
            self._options = self.last_replan_options(plan)
            self.sampler.clear()
        return moved

    def follow(self, dmp: Any, plan: ShardingPlan) -> None:
        """Observe ``dmp``, a job restarted in this process with :meth:`replan`'s ``plan``,
        priced by the updated network's prediction; the earlier job's samples are dropped."""
        if self.last_replan is None:
            raise ValueError("follow() needs a replan() first: it observes the plan it returned")
        check_observed_plan(plan, dmp, "follow(dmp, plan)")
        self.sampler.close()
        if str(plan) != str(self.plan):
            self.plan, self.prediction = plan, self.proposed
            self._options = self.last_replan_options(plan)
        self._dmp = dmp
        self.sampler.memory.attach(dmp, plan)
        self.sampler.restart(dmp)

    def last_replan_options(self, plan: ShardingPlan) -> list[Any] | None:
        """The options of ``plan`` where the last :meth:`replan` returned it (rank 0), else
        ``None``."""
        if self._replanned is None or str(plan) != self._replanned_plan:
            return None
        self.planned_correction = self.learned_correction
        return list(self._replanned)


def observe(
    planner: DreamShardPlanner,
    dmp: Any,
    pg: Any = None,
    every: int = EVERY,
    warmup: int = WARMUP,
    max_overhead: float | None = MAX_OVERHEAD,
    margin: float = MARGIN,
) -> JobObserver:
    """``JobObserver(planner.plan_record, dmp, ...)``, on every rank after the DMP is built.

    Args:
        planner: the planner whose ``collective_plan`` made the job's plan.
        dmp, pg, every, warmup, max_overhead, margin: as :class:`JobObserver`'s.

    Raises:
        ValueError: ``dmp`` was built from a plan other than the planner's last one.
    """
    return JobObserver(planner.plan_record, dmp, pg, every, warmup, max_overhead, margin)
