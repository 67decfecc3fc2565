"""Candidate sources from the planner side: plans the policy's safety net weighs but the
policy cannot make itself, because they come from TorchRec's planner (or, later, from a
user's proposer). See :class:`~torchrec_dreamshard.policy.protocol.CandidateSource`.

:func:`torchrec_placement` is TorchRec's planner as a placer: with TorchRec's defaults
(``torchrec``, the baseline DreamShard is compared with, which finds no plan at all when
memory is tight: a 15% heuristic reservation and TorchRec's storage estimate of optimizer
state and I/O buffers) or with another memory accounting (``torchrec_ours``: a table costs
its weights' bytes, nothing is reserved, so it always competes). :class:`TorchRecCandidate`
is the plan the user had before swapping planners: TorchRec's as it ships wherever that
finds one, ours where it does not. Every placer by name is in
:mod:`torchrec_dreamshard.evaluation.placers`.

:func:`default_sources` are those every safe-mode plan weighs: hand them to an agent for
good (``load_checkpoint(path, sources=default_sources())``) or for one call
(``agent.place(task, sources=default_sources())``).
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
    """TorchRec's ``EmbeddingShardingPlanner`` (table-wise fused sharding): the plan the
    user had before swapping planners, TorchRec's memory accounting first and, where that
    finds no plan, ours (weights' bytes, nothing reserved), so that it competes whenever
    whole tables fit.

    It declines tasks the safe mode plans in its bounded way
    (:func:`~torchrec_dreamshard.policy.is_large`): TorchRec's planner would take longer
    than the rest of the safety net there.

    It is a *baseline* (``baseline``): wherever plans are measured
    (:func:`~torchrec_dreamshard.verification.verification.verify`) it is measured too, and
    no plan that measured slower than it is kept; where nothing is measured, the planner's
    stats give the kept plan's predicted margin over it.

    Args:
        reserved: the task's memory is what a storage reservation left of the devices
            (``DreamShardPlanner``'s proposer: TorchRec's planner would have reserved the
            same), so TorchRec's storage estimate is used with nothing reserved again;
            ``False`` (a task file, the agent's API): the devices' whole memory, TorchRec's
            defaults as they ship.
    """

    name: str = TORCHREC_CANDIDATE
    baseline: bool = True
    reserved: bool = False

    def propose(self, task: Task) -> list[int] | None:
        """TorchRec's placement of ``task`` (``None`` on a large task).

        Raises:
            NoPlanError: TorchRec's planner found no plan by either accounting (the first
                accounting's message is kept).
        """
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
    """TorchRec's own plan of the planner's tables: the baseline candidate of
    ``DreamShardPlanner`` (``baseline``, as :class:`TorchRecCandidate`).

    The policy counts a table's weights against each device's memory scaled down to
    weights (the partitioner's ``policy_caps``); TorchRec counts its storage estimate
    (weights, optimizer state, input and output buffers) against the memory the storage
    reservation left. TorchRec's planner run in the policy's view would count the estimate
    against the scaled memory, and on a task whose big tables nearly fill their devices
    find no plan there, or another one. So the partitioner first asks for TorchRec's plan
    in the memory TorchRec counts (:meth:`plan_in`), gives the policy caps that admit it,
    and :meth:`propose` then offers that plan for the same tables; for tables it was not
    asked about (the type choice's calibration task, the split search's trials), it is
    :class:`TorchRecCandidate` with ``reserved=True``.
    """

    name: str = TORCHREC_CANDIDATE
    baseline: bool = True
    reserved: bool = True

    def __init__(self) -> None:
        self._plans: dict[tuple, tuple[int, ...]] = {}
        self._otherwise = TorchRecCandidate(reserved=True)

    def plan_in(self, task: Task) -> list[int] | None:
        """TorchRec's plan of ``task``'s tables, ``task.memory`` being what the storage
        reservation left of each device (TorchRec's storage estimate, nothing reserved
        again), remembered for :meth:`propose`; ``None`` (and nothing remembered) on a
        large task or where TorchRec's planner finds no plan."""
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
        """The plans :meth:`plan_in` found, by the names of their tables (in order)."""
        return {tuple(t.name for t in key[0]): plan for key, plan in self._plans.items()}

    def propose(self, task: Task) -> list[int] | None:
        """The plan :meth:`plan_in` found for these tables, else
        :class:`TorchRecCandidate`'s (``reserved=True``).

        Raises:
            NoPlanError: as :meth:`TorchRecCandidate.propose`, or the plan
                :meth:`plan_in` found does not fit ``task``'s memory (a device's share the
                partitioner shrank).
        """
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
    """What a remembered plan is for: the tables (their specs), the device count and the
    batch."""
    return tuple(task.tables), task.num_devices, task.batch_size


def default_sources(reserved: bool = False) -> tuple[CandidateSource, ...]:
    """The candidate sources of every safe-mode plan: TorchRec's planner as it ships
    (:class:`TorchRecCandidate`), or, ``reserved`` (inside ``DreamShardPlanner``, whose
    storage reservation has already been taken), :class:`TorchRecOwnPlan`."""
    return (TorchRecOwnPlan(),) if reserved else (TorchRecCandidate(),)


def torchrec_placement(
    task: Task, seed: int = 0, accounting: Accounting = "torchrec", compute_device: str = "cpu"
) -> list[int]:
    """TorchRec's ``EmbeddingShardingPlanner``, table-wise fused sharding only (see
    :func:`torchrec_dreamshard.planner.adapters.torchrec_adapter.plan_with_torchrec`).

    Args:
        task: the task (its batch is the global batch; TorchRec gets ``B / D`` per rank).
        seed: unused (the planner is deterministic).
        accounting: how TorchRec's planner counts memory (see
            :func:`~torchrec_dreamshard.planner.adapters.torchrec_adapter.plan_with_torchrec`):
            TorchRec's defaults, its estimate with nothing reserved, or weights' bytes only.
        compute_device: the topology TorchRec plans on, ``"cpu"`` or ``"cuda"`` (the
            task's memory as each GPU's HBM; no GPU is needed to plan for one).

    Raises:
        NoPlanError: TorchRec's planner found no plan (its message is kept).
    """
    # module names may not hold dots (a planner's tables are named by their FQN): plan
    # tables named t0, t1, ... and map the ranks back by position
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
