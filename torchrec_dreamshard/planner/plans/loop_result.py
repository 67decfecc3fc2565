"""What TorchRec's loop hands on, as values: its one stats call, held back
(:class:`DeferredStats`) so that the stats are logged once, for the plan the planner
returns, and the kept placement applied to the loop's options (:func:`with_ranks`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchrec.distributed.planner.planners import to_sharding_plan
from torchrec.distributed.planner.types import ShardingOption, Stats, Topology
from torchrec.distributed.types import ShardingPlan

from torchrec_dreamshard.planner.plans.plan_prediction import PlanPrediction
from torchrec_dreamshard.profile.machine_profile import MachineProfile

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.planner.steps.verify_step import Verdict


class DeferredStats(Stats):
    """The one stats logger TorchRec's loop is given: it keeps the loop's call
    (:attr:`call`, its keyword arguments) for :func:`replay` to log, once, for the plan
    the planner returns."""

    def __init__(self) -> None:
        self.call: dict[str, Any] | None = None

    def log(self, *args: Any, **kwargs: Any) -> None:
        """Keep the loop's call (TorchRec calls with keywords only)."""
        if args:
            raise TypeError("DeferredStats takes TorchRec's stats call by keyword only")
        self.call = dict(kwargs)

    def take(self) -> dict[str, Any] | None:
        """The kept call, once (``None`` where the loop logged nothing)."""
        call, self.call = self.call, None
        return call


def replay(
    loggers: Sequence[Stats],
    call: dict[str, Any],
    plan: ShardingPlan,
    options: list[ShardingOption],
    extra: dict[Stats, dict[str, Any]] | None = None,
) -> None:
    """Log ``call`` with every logger, for ``plan`` and its ``options``; ``extra``: more
    keywords for some loggers (ours take the prediction and the adaptation record)."""
    for stats in loggers:
        more = (extra or {}).get(stats, {})
        stats.log(**{**call, "sharding_plan": plan, "best_plan": options, **more})


def with_ranks(
    options: list[ShardingOption], kept: dict[str, int], topology: Topology
) -> tuple[list[ShardingOption], ShardingPlan]:
    """``options`` with the whole tables of ``kept`` (device by fully qualified name)
    moved there, and the sharding plan TorchRec builds of them."""
    for option in options:
        if option.fqn in kept:
            for shard in option.shards:
                shard.rank = kept[option.fqn]
    return options, to_sharding_plan(options, topology)


@dataclass(frozen=True)
class LastPlan:
    """What the last ``plan()`` made, as values (on a rank that did not plan: what rank
    0 sent).

    Attributes:
        profile: the machine profile it priced with.
        verdict: the verification's verdict.
        recalled: tables whose inputs came from a running job.
        prediction: the cost network's prediction of the plan.
        spent: what its seconds went on.
        sent: the adaptation record rank 0 sent (``collective_plan``'s other ranks).
    """

    profile: MachineProfile | None = None
    verdict: Verdict | None = None
    recalled: tuple[str, ...] = ()
    prediction: PlanPrediction | None = None
    spent: dict[str, float] | None = None
    sent: dict[str, Any] | None = None
