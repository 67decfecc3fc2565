"""``PolicyPlacer``: the policy's placement of its tables, the seam the partitioner calls.

The agent's placement where nothing may be split, else the column-wise split search. Only
``InsufficientMemoryError`` becomes TorchRec's ``PlannerError``; any other error raises.
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
        how: mode, roll-outs, seed and candidate sources of every ``agent.place``
            (``None``: safe, with ``default_sources(reserved=True)``).
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
        ``widths`` (minimum shard width) where it pays; a PlannerError where none fits."""
        try:
            task = self._task(specs, memory, oversized=bool(widths))
            return self._split(task, widths) if widths else self._whole(task)
        except InsufficientMemoryError as exc:  # the policy's PlacementError is one
            raise PlannerError(
                f"DreamShard could not place the tables: {exc}",
                PlannerErrorType.INSUFFICIENT_STORAGE,
            ) from exc

    def forget_report(self) -> None:
        """Drop the last placement's report."""
        self.last_report = None

    def torchrec_plan(self, specs: Sequence[TableSpec], memory: list[int]) -> list[int] | None:
        """TorchRec's own plan of ``specs`` from a :class:`TorchRecOwnPlan` source
        (``None``: greedy mode, no such source, or no plan)."""
        own = [s for s in self.how.sources or () if isinstance(s, TorchRecOwnPlan)]
        if not own or self.how.mode == "greedy":
            return None
        return own[0].plan_in(self._task(specs, memory, oversized=True))

    def fixed(
        self, specs: Sequence[TableSpec], memory: list[int], placement: list[int]
    ) -> SplitPlan:
        """``placement`` of ``specs`` as a plan of whole tables."""
        return whole_plan(self._task(specs, memory, oversized=True), placement)

    def _task(self, specs: Sequence[TableSpec], memory: list[int], oversized: bool) -> Task:
        return Task(
            tables=list(specs),
            num_devices=len(memory),
            memory_bytes=memory,
            batch_size=self._batch_size,
            allow_oversized=oversized,
        )

    def _whole(self, task: Task) -> SplitPlan:
        placement = self.how.place(self._agent, task)
        self.last_report = self._agent.last_report
        return whole_plan(task, placement)

    def _split(self, task: Task, widths: dict[str, int]) -> SplitPlan:
        found = plan_with_splits(self._agent, task, self.how, splittable=widths)
        # the report describes the whole-table placement; a split plan is re-placed
        self.last_report = None if found.sharded.columns else self._agent.last_report
        return found


def whole_plan(task: Task, placement: Sequence[int]) -> SplitPlan:
    """``placement`` of ``task``'s tables as a plan of whole tables."""
    return SplitPlan(shard_task(task, {}), list(placement), math.nan, None)
