"""What :class:`~torchrec_dreamshard.planner.planners.DreamShardPlanner` offers the job it
planned: how it adapted to the machine (:attr:`Replanning.adaptation`),
:meth:`Replanning.observe` (a
:class:`~torchrec_dreamshard.feedback.observer.JobObserver` on the DMP module), and what
the observer's re-plan reads of the planner: the plan's options and batch, the agent before
calibration, the model as planned, and a planner of the same arguments with another agent.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torchrec.distributed.planner.types import ShardingOption, Topology

from torchrec_dreamshard.torchrec_compat import best_plan, planner_batch_size, planner_topology

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.calibration import CalibrationConfig
    from torchrec_dreamshard.feedback.observer import JobObserver
    from torchrec_dreamshard.measure.spent import Spending
    from torchrec_dreamshard.policy import DreamShard


def meta_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers are on the meta device (a plan
    needs shapes only): what a re-plan plans after ``DistributedModelParallel`` has
    sharded the original in place."""
    memo: dict[int, Any] = {}
    for p in module.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(module, memo)


class Replanning:
    """Mixed into ``DreamShardPlanner`` (which sets ``_arguments``, its constructor's
    arguments, and ``_planned``, the model and sharders of the last ``collective_plan`` on
    rank 0, as a meta copy)."""

    _arguments: dict[str, Any]
    _adaptation: dict[str, Any] | None
    _spent: Spending | None = None  # what the last plan() spent its time on
    _planned: tuple[nn.Module, list] | None = None
    _recalled: list[str] = []  # tables whose inputs the last plan took from a running job

    def observe(
        self,
        dmp: Any,
        pg: Any = None,
        every: int = 20,
        warmup: int = 5,
        max_overhead: float | None = 0.01,
    ) -> JobObserver:
        """A :class:`~torchrec_dreamshard.feedback.observer.JobObserver` of the job this
        planner planned (call it on every rank, after ``DistributedModelParallel``):
        ``observer.step()`` after each training step, then ``observer.report()`` and
        ``observer.replan()`` (both collective).

        Args:
            dmp: the job's ``DistributedModelParallel`` module.
            pg: the job's process group (default: the world).
            every: sample at most one step in ``every`` (the others cost a clock read).
            warmup: steps before the first sample.
            max_overhead: sample less often where sampling would cost more than this share
                of the job's time (``None``: one step in ``every`` whatever it costs).
        """
        from torchrec_dreamshard.feedback.observer import JobObserver

        return JobObserver(self, dmp, pg=pg, every=every, warmup=warmup, max_overhead=max_overhead)

    @property
    def adaptation(self) -> dict[str, Any]:
        """How the last plan adapted to this machine (JSON-able): whether the planner
        calibrated, why (the reference kernel predicted against measured), and the cost
        network's error before and after, the tables whose inputs it took from what a
        running job fed them (``inputs_from_job``), and what the plan spent its seconds on
        (``spent_s``: measuring the ``collectives``, the ``dense_kernel`` and the
        ``reference_kernel``, ``calibration``, ``verification``, each without what the
        others inside it took, and ``planning`` for the rest; only what it did, so on a
        warm cache ``planning`` alone); on every rank after ``collective_plan``."""
        if self._adaptation is not None:
            return self._adaptation
        from torchrec_dreamshard.calibration import CalibratingAgent

        if not isinstance(self.agent, CalibratingAgent):
            out = {"mode": "off", "calibrated": False, "why": "calibrate=False"}
        else:
            out = self.agent.adaptation()
        if self._recalled:
            out["inputs_from_job"] = list(self._recalled)
        types = self.proposer.last_types
        if types is not None:  # the type choice: each decision, its margin and what tipped it
            out["types"] = types.to_dict()
        if self._spent is not None:
            out["spent_s"] = self._spent.seconds()
        return out

    @property
    def topology(self) -> Topology:
        return planner_topology(self)

    @property
    def global_batch(self) -> int:
        """The batch each table-wise kernel processes: per-rank batch x world size."""
        return planner_batch_size(self) * planner_topology(self).world_size

    @property
    def best_options(self) -> list[ShardingOption]:
        """The sharding options of the last plan (on the rank that planned)."""
        options = best_plan(self)
        if options is None:
            raise ValueError("the planner has no plan on this rank (rank 0 plans)")
        return options

    @property
    def prior_agent(self) -> DreamShard:
        """The agent before calibration (the checkpoint's)."""
        from torchrec_dreamshard.calibration import CalibratingAgent

        agent = self.agent
        return agent.prior if isinstance(agent, CalibratingAgent) else agent

    @property
    def planned_inputs(self) -> tuple[nn.Module, list]:
        """The model (a meta copy) and sharders of the last ``plan``."""
        if self._planned is None:
            raise ValueError(
                "the planner has no model to plan again on this rank: rank 0 keeps it "
                "when it plans through collective_plan"
            )
        return self._planned

    def _recall_inputs(self, module: nn.Module) -> None:
        """Where the planner learns (``calibrate`` is not ``False``), take what running jobs
        of these tables fed them, as the store keeps it (``JobObserver.replan`` keeps it),
        over the declared pooling factors and the sample batches' reuse: a restarted job
        plans its tables as its last run fed them."""
        from torchrec_dreamshard.calibration import CalibratingAgent
        from torchrec_dreamshard.calibration.fed_inputs_store import recalled_inputs

        self._recalled = []
        if not isinstance(self.agent, CalibratingAgent) or self.agent.calibration is None:
            return
        pooling, reuse = recalled_inputs(self.calibration_config().store_path(), module)
        self.table_specs.learn(pooling, reuse)
        self._recalled = sorted(pooling)

    def calibration_config(self) -> CalibrationConfig:
        """The calibration settings the planner calibrates with (or would), measuring
        nothing: the store the job's observations join."""
        import dataclasses

        from torchrec_dreamshard.calibration import CalibratingAgent, CalibrationConfig
        from torchrec_dreamshard.measure.config import MeasureConfig

        agent = self.agent
        if isinstance(agent, CalibratingAgent) and agent.calibration is not None:
            base = agent.calibration
        else:
            device = "cuda" if planner_topology(self).compute_device == "cuda" else "cpu"
            base = CalibrationConfig(measure=MeasureConfig(device=device))
        return dataclasses.replace(base, measure_missing=False, progress=False)

    @property
    def constraints_given(self) -> dict[str, Any] | None:
        """The ``constraints`` the planner was built with."""
        return self._arguments.get("constraints")

    def replanner(self, agent: DreamShard, **overrides: Any) -> Any:
        """A planner of this one's arguments that plans with ``agent`` as it is;
        ``overrides`` replace arguments (a re-plan's observed ``constraints`` and
        ``sample_batches``)."""
        arguments = {k: v for k, v in self._arguments.items() if k not in ("checkpoint",)}
        arguments.update(overrides)
        arguments.update(agent=agent, calibrate=False, verify=0)
        return type(self)(**arguments)
