"""``PolicyPlacer``: the policy's placement of the tables it places, the seam the
partitioner calls (:class:`~torchrec_dreamshard.planner.stages.partitioners.DreamShardPartitioner`).

Given the tables' specs and each device's memory, it returns a
:class:`~torchrec_dreamshard.policy.split_search.SplitPlan`: where nothing may be split, the
agent's placement as it is (``PlacementAgent.place``: the mode's roll-outs, the safety net,
and, for a calibrating agent, its calibration); where tables may be split column-wise, the
split search (:func:`torchrec_dreamshard.policy.split_search.plan_with_splits`), which cuts
a table too big for every device to fit and others when the cost network predicts a faster
step.

Only a placement that does not fit (:class:`~torchrec_dreamshard.data.tasks.
InsufficientMemoryError`: the task's memory check, the policy's roll-outs, the split
search) becomes TorchRec's ``PlannerError`` of insufficient storage, which TorchRec's loop
takes as a proposal that does not partition. Any other error raises as itself, out of the
planner's ``plan``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from torchrec.distributed.planner.types import PlannerError, PlannerErrorType

from torchrec_dreamshard.data.splits import shard_task
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import InsufficientMemoryError, Task
from torchrec_dreamshard.planner.stages.candidates import TorchRecOwnPlan, default_sources
from torchrec_dreamshard.policy.agent import check_mode
from torchrec_dreamshard.policy.protocol import PlacementAgent, PlaceSettings
from torchrec_dreamshard.policy.safety_net import SafetyReport
from torchrec_dreamshard.policy.split_search import SplitPlan, plan_with_splits


class PolicyPlacer:
    """Places tables with the policy, splitting those it may.

    Args:
        agent: the DreamShard agent.
        batch_size: the *global* batch the table-wise kernels process.
        how: the mode (``"safe"``, ``"greedy"`` or ``"search"``, see
            ``DreamShardPlanner``; ``None``: safe), sampled roll-outs, seed and candidate
            sources (``None``: :func:`~torchrec_dreamshard.planner.stages.candidates.
            default_sources`, TorchRec's plan on ``memory``, what the storage reservation
            left) of every ``agent.place``.
    """

    def __init__(
        self, agent: PlacementAgent, batch_size: int, how: PlaceSettings | None = None
    ) -> None:
        how = how if how is not None else PlaceSettings(mode="safe", num_samples=4)
        check_mode(how.mode)
        self._agent = agent
        self._batch_size = batch_size
        self.how = how if how.sources else replace(how, sources=default_sources(reserved=True))
        self.last_report: SafetyReport | None = None  # the safety net's, unsplit plans

    def place(
        self, specs: Sequence[TableSpec], memory: list[int], widths: dict[str, int]
    ) -> SplitPlan:
        """A plan of ``specs`` on devices of ``memory`` bytes, splitting the tables in
        ``widths`` (shards at least that many columns wide) where it pays.

        Raises:
            PlannerError: the tables do not fit (``INSUFFICIENT_STORAGE``; the
                ``InsufficientMemoryError`` that said so is its cause).
        """
        try:
            task = self._task(specs, memory, oversized=bool(widths))
            return self._split(task, widths) if widths else self._whole(task)
        except InsufficientMemoryError as exc:  # the policy's PlacementError is one
            raise PlannerError(
                f"DreamShard could not place the tables: {exc}",
                PlannerErrorType.INSUFFICIENT_STORAGE,
            ) from exc

    def forget_report(self) -> None:
        """Drop the report of the last placement (a new proposal is being placed)."""
        self.last_report = None

    def torchrec_plan(self, specs: Sequence[TableSpec], memory: list[int]) -> list[int] | None:
        """TorchRec's own plan of ``specs`` on devices of ``memory`` bytes as TorchRec counts
        them (what its storage reservation left), from the placer's
        :class:`~torchrec_dreamshard.planner.stages.candidates.TorchRecOwnPlan` source, which then
        offers it to the safety net for the same tables; ``None`` in greedy mode (which
        weighs no candidates), where there is no such source or where TorchRec's planner
        finds no plan."""
        own = [s for s in self.how.sources or () if isinstance(s, TorchRecOwnPlan)]
        if not own or self.how.mode == "greedy":
            return None
        return own[0].plan_in(self._task(specs, memory, oversized=True))

    def fixed(
        self, specs: Sequence[TableSpec], memory: list[int], placement: list[int]
    ) -> SplitPlan:
        """``placement`` of ``specs`` as a plan of whole tables (nothing split)."""
        return whole_plan(self._task(specs, memory, oversized=True), placement)

    def _task(self, specs: Sequence[TableSpec], memory: list[int], oversized: bool) -> Task:
        """``specs`` on devices of ``memory`` bytes at the placer's batch (``oversized``:
        tables bigger than every device are accepted)."""
        return Task(
            tables=list(specs),
            num_devices=len(memory),
            memory_bytes=memory,
            batch_size=self._batch_size,
            allow_oversized=oversized,
        )

    def _whole(self, task: Task) -> SplitPlan:
        """The agent's placement as it is (nothing may be split)."""
        placement = self.how.place(self._agent, task)
        self.last_report = self._agent.last_report
        return whole_plan(task, placement)

    def _split(self, task: Task, widths: dict[str, int]) -> SplitPlan:
        """The split search's plan."""
        found = plan_with_splits(self._agent, task, self.how, splittable=widths)
        # the report describes the whole-table placement; a split plan is re-placed
        self.last_report = None if found.sharded.columns else self._agent.last_report
        return found


def whole_plan(task: Task, placement: Sequence[int]) -> SplitPlan:
    """``placement`` of ``task``'s tables as a plan of whole tables (nothing split)."""
    return SplitPlan(shard_task(task, {}), list(placement), math.nan, None)
