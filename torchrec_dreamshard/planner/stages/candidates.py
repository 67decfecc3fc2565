"""Candidate sources from TorchRec's planner: plans the policy's safety net weighs but
cannot make itself (:class:`~torchrec_dreamshard.policy.protocol.CandidateSource`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torchrec.distributed.planner.types import PlannerError

from torchrec_dreamshard.data.tasks import NoPlanError, Task, check_placement, device_bytes
from torchrec_dreamshard.planner.adapters.torchrec_adapter import Accounting, plan_with_torchrec
from torchrec_dreamshard.policy import CandidateSource, is_large

TORCHREC_CANDIDATE = "torchrec_ours"  # its name in candidate reports and stats


@dataclass(frozen=True)
class TorchRecCandidate:
    """TorchRec's table-wise fused plan (TorchRec's memory accounting, else weights'
    bytes): a baseline, measured wherever plans are; declines large tasks.

    Args:
        reserved: ``task.memory`` is what a storage reservation left, not whole devices.
    """

    name: str = TORCHREC_CANDIDATE
    baseline: bool = True
    reserved: bool = False

    def propose(self, task: Task) -> list[int] | None:
        """TorchRec's placement of ``task``; a NoPlanError where neither accounting fits."""
        if is_large(task):
            return None
        try:
            return torchrec_placement(
                task, accounting="unreserved" if self.reserved else "torchrec"
            )
        except NoPlanError as exc:
            try:
                return torchrec_placement(task, accounting="weights")
            except NoPlanError:
                raise exc from None


class TorchRecOwnPlan:
    """TorchRec's own plan of the planner's tables: ``DreamShardPlanner``'s baseline.

    The partitioner finds it with :meth:`plan_in`; :meth:`propose` offers it for the same
    tables, else :class:`TorchRecCandidate`'s.
    """

    name: str = TORCHREC_CANDIDATE
    baseline: bool = True
    reserved: bool = True

    def __init__(self) -> None:
        self._plans: dict[tuple, tuple[int, ...]] = {}
        self._otherwise = TorchRecCandidate(reserved=True)

    def plan_in(self, task: Task) -> list[int] | None:
        """TorchRec's plan of ``task``, remembered for :meth:`propose` (``None``: none)."""
        key = _tables_key(task)
        self._plans.pop(key, None)
        if is_large(task):
            return None
        try:
            placement = torchrec_placement(task, accounting="unreserved")
        except NoPlanError:
            return None
        self._plans[key] = tuple(placement)
        return placement

    @property
    def plans(self) -> dict[tuple[str, ...], tuple[int, ...]]:
        """The plans :meth:`plan_in` found, by their tables' names."""
        return {tuple(t.name for t in key[0]): plan for key, plan in self._plans.items()}

    def propose(self, task: Task) -> list[int] | None:
        """The plan :meth:`plan_in` found for these tables, else
        :class:`TorchRecCandidate`'s; a NoPlanError where it does not fit ``task.memory``."""
        found = self._plans.get(_tables_key(task))
        if found is None:
            return self._otherwise.propose(task)
        used = device_bytes(task, found)
        over = [d for d, (u, cap) in enumerate(zip(used, task.memory, strict=True)) if u > cap]
        if over:  # a share the partitioner shrank
            raise NoPlanError(
                f"TorchRec's plan puts more weights on devices {over} than the policy's "
                "share of their memory"
            )
        return check_placement(task, list(found))


def _tables_key(task: Task) -> tuple:
    return tuple(task.tables), task.num_devices, task.batch_size


def default_sources(reserved: bool = False) -> tuple[CandidateSource, ...]:
    """The candidate sources of a safe-mode plan (``reserved``: inside the planner)."""
    return (TorchRecOwnPlan(),) if reserved else (TorchRecCandidate(),)


def torchrec_placement(
    task: Task, seed: int = 0, accounting: Accounting = "torchrec", compute_device: str = "cpu"
) -> list[int]:
    """Each table's rank in TorchRec's table-wise fused plan of ``task``.

    Args:
        seed: unused (the planner is deterministic).
        accounting: how TorchRec counts memory (``plan_with_torchrec``).

    Raises:
        NoPlanError: TorchRec's planner found no plan (its message is kept).
    """
    # module names may not hold dots: plan tables t0, t1, ... and map back by position
    renamed = Task(
        tables=[dataclasses.replace(t, name=f"t{i}") for i, t in enumerate(task.tables)],
        num_devices=task.num_devices,
        memory_bytes=list(task.memory),
        batch_size=task.batch_size,
    )
    try:
        ranks = plan_with_torchrec(renamed, accounting, compute_device)
    except PlannerError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NoPlanError(f"TorchRec's planner found no plan: {first}") from None
    missing = [
        t.name for t, r in zip(task.tables, renamed.tables, strict=True) if r.name not in ranks
    ]
    if missing:
        raise NoPlanError(f"TorchRec's plan has no rank for tables {missing}")
    return check_placement(task, [ranks[t.name] for t in renamed.tables])
