"""Every placer the benchmarks and ``dreamshard collect --placer`` compare, by name
(:data:`PLACERS`): random, the proxy heuristics, TorchRec's planner (``torchrec``; with
our memory accounting ``torchrec_ours``), DreamShard's modes (which need an agent;
``dreamshard_split`` may return ``{"columns": ..., "placement": ...}``) and
``measured_greedy``. A placer that finds no plan raises
:class:`~torchrec_dreamshard.data.tasks.NoPlanError`."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import (
    InsufficientMemoryError,
    NoPlanError,
    Task,
    check_placement,
    random_placement,
)
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.planner.stages.candidates import torchrec_placement
from torchrec_dreamshard.policy import PlacementAgent, PlacementError, PlaceSettings
from torchrec_dreamshard.policy.heuristics import HEURISTICS, proxy_greedy

Plan = list[int] | dict[str, Any]


@dataclass(frozen=True)
class PlacingInputs:
    """What a placer may use beyond the task and the seed.

    Attributes:
        agent: the agent DreamShard's modes place with (``None``: they cannot run).
        num_samples: the agent's sampled roll-outs (``None``: its default).
        measure: ``measured_greedy``'s kernel settings (``None``: the defaults).
    """

    agent: PlacementAgent | None = None
    num_samples: int | None = None
    measure: MeasureConfig | None = None


Placer = Callable[[Task, int, PlacingInputs], Plan]


def _heuristic(proxy: str) -> Placer:
    return lambda task, seed, inputs: proxy_greedy(task, proxy)


def _needs_agent(inputs: PlacingInputs, mode: str) -> PlacementAgent:
    if inputs.agent is None:
        raise ValueError(f"DreamShard's {mode} mode needs an agent: PlacingInputs(agent=...)")
    return inputs.agent


def _samples(inputs: PlacingInputs) -> dict[str, int]:
    return {} if inputs.num_samples is None else {"num_samples": inputs.num_samples}


def _dreamshard(mode: str) -> Placer:
    def place(task: Task, seed: int, inputs: PlacingInputs) -> Plan:
        agent = _needs_agent(inputs, mode)
        try:
            return agent.place(task, mode=mode, seed=seed, **_samples(inputs))
        except PlacementError as exc:  # a table with no room: no plan
            raise NoPlanError(str(exc)) from None

    return place


def _dreamshard_split(task: Task, seed: int, inputs: PlacingInputs) -> Plan:
    from torchrec_dreamshard.policy.split_search import plan_with_splits

    agent = _needs_agent(inputs, "split")
    try:
        found = plan_with_splits(
            agent, task, PlaceSettings(num_samples=inputs.num_samples, seed=seed)
        )
    except InsufficientMemoryError as exc:  # no placement even after splitting (says why)
        raise NoPlanError(str(exc)) from None
    placement = [int(d) for d in found.placement]
    if not found.sharded.columns:
        return placement
    return {"columns": found.sharded.counts, "placement": placement}


def single_ms(spec: TableSpec, batch_size: int, config: MeasureConfig) -> float:
    """Table ``spec`` alone on one device: measured fwd + bwd (ms)."""
    from torchrec_dreamshard.measure import time_fused_kernel

    return float(sum(time_fused_kernel([spec], batch_size, config)))


def _measured_greedy(task: Task, seed: int, inputs: PlacingInputs) -> Plan:
    from torchrec_dreamshard.policy.safety_net import memory_aware_greedy

    config = inputs.measure or MeasureConfig()
    costs = [single_ms(t, task.batch_size, config) for t in task.tables]
    plan = memory_aware_greedy(task, costs)
    if plan is None:
        raise NoPlanError("no device order fits memory")
    return plan


PLACERS: dict[str, Placer] = {
    "random": lambda task, seed, inputs: random_placement(task, seed),
    **{name: _heuristic(proxy) for name, proxy in HEURISTICS.items()},
    "torchrec": lambda task, seed, inputs: torchrec_placement(task),
    "torchrec_ours": lambda task, seed, inputs: torchrec_placement(task, accounting="weights"),
    "dreamshard": _dreamshard("safe"),
    "dreamshard_split": _dreamshard_split,
    "dreamshard_greedy": _dreamshard("greedy"),
    "dreamshard_search": _dreamshard("search"),
    "measured_greedy": _measured_greedy,
}


def place(name: str, task: Task, seed: int = 0, inputs: PlacingInputs | None = None) -> Plan:
    """The plan placer ``name`` (one of :data:`PLACERS`) makes of ``task``.

    Raises:
        ValueError: an unknown name, or an agent's mode without an agent.
        NoPlanError: the placer finds no plan.
    """
    if name not in PLACERS:
        raise ValueError(f"unknown placer {name!r}; choose from {sorted(PLACERS)}")
    plan = PLACERS[name](task, seed, inputs or PlacingInputs())
    return plan if isinstance(plan, dict) else check_placement(task, plan)


def plan_each(
    names: Sequence[str],
    task: Task,
    seed: int = 0,
    inputs: PlacingInputs | None = None,
    labels: Sequence[str] | None = None,
) -> tuple[dict[str, Plan | None], dict[str, Any]]:
    """Every named placer's plan of ``task`` (``None`` where it finds none) and the seconds
    each took (``"<label>_error"``: why it found none), by label (default: the names)."""
    plans: dict[str, Plan | None] = {}
    secs: dict[str, Any] = {}
    for name, label in zip(names, labels or names, strict=True):
        start = time.perf_counter()
        try:
            plans[label] = place(name, task, seed, inputs)
        except NoPlanError as exc:
            plans[label], secs[f"{label}_error"] = None, str(exc)
        secs[label] = time.perf_counter() - start
    return plans, secs
