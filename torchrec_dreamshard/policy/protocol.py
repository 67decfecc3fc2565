"""The agent's interface (:class:`PlacementAgent`) and how plans from outside the policy
reach its safety net (:class:`CandidateSource`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from torchrec_dreamshard.data.tasks import Task, check_placement
from torchrec_dreamshard.policy.heuristics import NoPlanError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy.safety_net import SafetyReport


@dataclass
class CostPrediction:
    """The cost network's view of a placement (ms, at the task's batch size).

    Attributes:
        fwd_ms: per device, forward (0 for an empty device); ``bwd_ms`` and ``comm_ms`` alike.
        step_ms: the step cost (the slowest device's total).
        step_log_std: the members' spread of log step cost (0.1: about 10%).
    """

    fwd_ms: list[float]
    bwd_ms: list[float]
    comm_ms: list[float]
    step_ms: float
    step_log_std: float = 0.0

    @property
    def total_ms(self) -> list[float]:
        """Per device ``fwd + bwd + comm``."""
        return [f + b + c for f, b, c in zip(self.fwd_ms, self.bwd_ms, self.comm_ms, strict=True)]


__all__ = ["CandidateSource", "FixedPlan", "NoPlanError", "PlaceSettings", "PlacementAgent"]


@dataclass(frozen=True)
class PlaceSettings:
    """How to call :meth:`PlacementAgent.place`, as one value (``None``: the agent's default).

    Attributes:
        mode: ``"safe"``, ``"greedy"`` or ``"search"``.
        num_samples: sampled policy roll-outs.
        sources: candidate sources for the call.
    """

    mode: str | None = None
    num_samples: int | None = None
    seed: int = 0
    sources: tuple[CandidateSource, ...] | None = None

    def __post_init__(self) -> None:
        if self.num_samples is not None and self.num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {self.num_samples}")
        if self.sources is not None and not isinstance(self.sources, tuple):
            object.__setattr__(self, "sources", tuple(self.sources))

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``agent.place`` (the agent's defaults left out)."""
        out: dict[str, Any] = {"seed": self.seed}
        if self.mode is not None:
            out["mode"] = self.mode
        if self.num_samples is not None:
            out["num_samples"] = self.num_samples
        if self.sources is not None:
            out["sources"] = self.sources
        return out

    def place(self, agent: PlacementAgent, task: Task) -> list[int]:
        """``agent.place(task)`` with these settings, as a list of ints."""
        return [int(d) for d in agent.place(task, **self.kwargs())]


@runtime_checkable
class CandidateSource(Protocol):
    """A source of candidate plans for the safety net (safe mode), given to the agent or to
    one ``place`` call. One with ``baseline = True`` is the user's plan without DreamShard,
    which the verification always measures and never keeps a slower plan than.

    Attributes:
        name: the candidates' name in the safety net's report (unique).
    """

    name: str

    def propose(self, task: Task) -> Sequence[int] | None:
        """A device per table of ``task``, or ``None`` when the source offers nothing.

        Raises:
            NoPlanError: the source looked and found none.
        """
        ...


@dataclass(frozen=True)
class FixedPlan:
    """A candidate source that offers one given placement (a user's plan, say)."""

    name: str
    placement: tuple[int, ...]

    def propose(self, task: Task) -> list[int]:
        """The placement, checked against ``task`` (a ``ValueError`` names what is wrong)."""
        return check_placement(task, list(self.placement))


@runtime_checkable
class PlacementAgent(Protocol):
    """Every member of an agent that code outside the agent touches (``DreamShard``,
    ``CalibratingAgent``).

    Attributes:
        last_report: the safety net's report of the last safe or search placement (``None``
            after a greedy one, or before any).
    """

    last_report: SafetyReport | None

    @property
    def meta(self) -> dict[str, Any]:
        """Metadata (hardware fingerprint, workload, version, ...)."""
        ...

    @property
    def calibration_enabled(self) -> bool:
        """Whether ``place`` calibrates the cost network on this machine."""
        ...

    @property
    def without_measuring(self) -> PlacementAgent:
        """The agent that places without measuring (itself, for one that never measures)."""
        ...

    def prepare(self, task: Task, sources: Sequence[CandidateSource] | None = None) -> None:
        """Get ready to price ``task``'s tables: a calibrating agent calibrates on them here."""
        ...

    def place(
        self,
        task: Task,
        mode: str = "safe",
        num_samples: int = 4,
        seed: int = 0,
        sources: Sequence[CandidateSource] | None = None,
    ) -> list[int]:
        """A device per table within every device's memory (``sources``: this call's sources)."""
        ...

    def predict(self, task: Task, placement: Sequence[int]) -> CostPrediction:
        """The cost network's per-device and overall cost of ``placement``."""
        ...

    def table_costs(self, task: Task) -> np.ndarray:
        """Predicted single-table fwd + bwd + comm (ms) of each table, alone on a device."""
        ...

    def fingerprint(self) -> str:
        """A digest of everything that decides the agent's plans."""
        ...
