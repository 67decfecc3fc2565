"""The trained agent, :class:`DreamShard`: cost network, policy and metadata behind
``place``, ``predict`` and ``table_costs``."""

from __future__ import annotations

import hashlib
import json
import math
import typing
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch

from torchrec_dreamshard.cost.cost_net import CostNet, cost_inputs, device_context, single_thread
from torchrec_dreamshard.data.tasks import Task, check_placement
from torchrec_dreamshard.policy.heuristics import NoPlanError
from torchrec_dreamshard.policy.mdp import EstimatedMDP, alone_on_a_device
from torchrec_dreamshard.policy.policy_net import PolicyNet, build_networks
from torchrec_dreamshard.policy.protocol import CandidateSource, CostPrediction, PlaceSettings
from torchrec_dreamshard.policy.safety_net import (
    DEFAULT_PENALTY,
    DEFAULT_SAMPLES,
    REFINE_STEPS,
    REFINE_TOP,
    SafetyReport,
    Scorer,
    choose,
    heuristic_candidates,
)
from torchrec_dreamshard.version import __version__

PlacementMode = Literal["safe", "greedy", "search"]
PLACEMENT_MODES: tuple[str, ...] = typing.get_args(PlacementMode)


def check_mode(mode: object) -> PlacementMode:
    """``mode`` where it is a placement mode (a ``ValueError`` naming the modes else)."""
    if mode not in PLACEMENT_MODES:
        raise ValueError(f"mode must be one of {PLACEMENT_MODES}, got {mode!r}")
    return mode  # type: ignore[return-value]


LARGE_TASK = 20_000  # tables x devices beyond which the safe mode plans in a bounded way


def is_large(task: Task) -> bool:
    """Whether the safe mode plans ``task`` in its bounded way (see :data:`LARGE_TASK`)."""
    return len(task.tables) * task.num_devices > LARGE_TASK


def check_sources(sources: Sequence[CandidateSource]) -> tuple[CandidateSource, ...]:
    """``sources`` as a tuple, each checked to be a candidate source (else a ``TypeError``)."""
    out = tuple(sources)
    for k, source in enumerate(out):
        if not isinstance(source, CandidateSource):
            raise TypeError(
                f"candidate source {k} ({source!r}) needs a `name` and a "
                "`propose(task)` method (policy.protocol.CandidateSource)"
            )
    return out


def source_candidates(
    task: Task, sources: Sequence[CandidateSource], taken: Sequence[str] = ()
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The plans of ``sources`` by name, and the messages of those that found none.

    Raises:
        ValueError: a name is shared, or a source's plan does not fit ``task`` (named).
    """
    plans: dict[str, np.ndarray] = {}
    failed: dict[str, str] = {}
    seen = set(taken)
    for source in sources:
        if source.name in seen:
            raise ValueError(f"candidate source name {source.name!r} is used twice")
        seen.add(source.name)
        try:
            placement = source.propose(task)
            if placement is not None:
                plans[source.name] = np.asarray(check_placement(task, placement))
        except NoPlanError as exc:
            failed[source.name] = str(exc)
        except ValueError as exc:
            raise ValueError(f"candidate source {source.name!r}: {exc}") from exc
    return plans, failed


class DreamShard:
    """The trained agent (a :class:`~torchrec_dreamshard.policy.protocol.PlacementAgent`).

    Args:
        policy: the policy network (input width: the cost network's ``enc_dim``).
        meta: metadata (hardware fingerprint, workload, version, ...).
        penalty: ensemble standard deviations of log cost the safety net adds.
        sources: candidate sources the safe mode weighs, unless ``place`` is given others.
    """

    calibration_enabled: bool = False  # place never measures

    def __init__(
        self,
        cost_net: CostNet,
        policy: PolicyNet,
        meta: dict[str, Any] | None = None,
        penalty: float = DEFAULT_PENALTY,
        sources: Sequence[CandidateSource] = (),
    ):
        if cost_net.enc_dim != policy.in_dim:
            raise ValueError(
                f"cost net state width {cost_net.enc_dim} and policy input width "
                f"{policy.in_dim} differ"
            )
        self.cost_net = cost_net.eval()
        self.policy = policy.eval()
        self.penalty = penalty
        self.sources = check_sources(sources)
        self.meta: dict[str, Any] = dict(meta or {})
        for key, value in {**cost_net.config(), **policy.config()}.items():
            self.meta.setdefault(key, value)
        self.last_report: SafetyReport | None = None

    @classmethod
    def untrained(
        cls,
        seed: int = 0,
        hidden: int = 16,
        members: int = 5,
        policy_hidden: int = 64,
        sources: Sequence[CandidateSource] = (),
    ) -> DreamShard:
        """Randomly initialised default networks (deterministic in ``seed``)."""
        torch.manual_seed(seed)
        sizes = {"hidden": hidden, "members": members, "policy_hidden": policy_hidden}
        net, policy = build_networks(sizes)
        meta = {"trained": False, "seed": seed, "version": __version__}
        return cls(net, policy, meta, sources=sources)

    @property
    def without_measuring(self) -> DreamShard:
        return self

    def prepare(self, task: Task, sources: Sequence[CandidateSource] | None = None) -> None:
        """Nothing to do: this agent prices every task as it is."""

    def fingerprint(self) -> str:
        """A digest of the weights and metadata (equal ones place every task the same)."""
        digest = hashlib.sha256(json.dumps(self.meta, sort_keys=True, default=str).encode())
        digest.update(repr(self.penalty).encode())
        for net in (self.cost_net, self.policy):
            for name, tensor in sorted(net.state_dict().items()):
                digest.update(name.encode())
                digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()

    # -- helpers --------------------------------------------------------------------------

    def inputs(self, task: Task) -> np.ndarray:
        return cost_inputs(task.tables, task.batch_size)

    def mdp(self, task: Task) -> EstimatedMDP:
        return EstimatedMDP(self.cost_net, task, self.inputs(task))

    def scorer(self, task: Task, enc: torch.Tensor | None = None) -> Scorer:
        if enc is None:
            enc = self.cost_net.encode(torch.from_numpy(self.inputs(task)))
        ctx = device_context(task.num_devices, sum(t.dim for t in task.tables))
        return Scorer(self.cost_net, task, enc, ctx, self.penalty)

    # -- public API -----------------------------------------------------------------------

    def place(
        self,
        task: Task,
        mode: str = "safe",
        num_samples: int = DEFAULT_SAMPLES,
        seed: int = 0,
        sources: Sequence[CandidateSource] | None = None,
    ) -> list[int]:
        """A device per table, in ``task.tables`` order, within every device's memory.

        Args:
            mode: ``"safe"``: the safety net (on :func:`is_large` tasks no sampled roll-outs
                and one refined candidate); ``"greedy"``: the policy's greedy roll-out;
                ``"search"``: the policy's roll-outs alone, scored and refined.
            num_samples: sampled roll-outs (search and safe modes).
            sources: this call's candidate sources (``None``: the agent's own).

        Raises:
            PlacementError: a table fits on no device (named).
        """
        check_mode(mode)
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        with single_thread(), torch.no_grad():
            return self._place(task, PlaceSettings(mode, num_samples, seed, sources))

    @single_thread()
    @torch.no_grad()
    def candidates(
        self,
        task: Task,
        mode: str = "safe",
        num_samples: int = DEFAULT_SAMPLES,
        seed: int = 0,
        sources: Sequence[CandidateSource] | None = None,
        mdp: EstimatedMDP | None = None,
    ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """The unrefined candidate plans of ``mode`` by name, and the messages of sources
        that found none."""
        if mode not in ("safe", "search"):
            raise ValueError(f"candidates are those of the safe or search mode, got {mode!r}")
        mdp = mdp or self.mdp(task)
        named = {"policy_greedy": mdp.rollout(self.policy, 1, greedy=True).placements[0]}
        large = is_large(task)
        if mode == "safe" and large:
            num_samples = 0  # bounded planning time on the largest tasks
        if num_samples:
            gen = torch.Generator().manual_seed(seed)
            rolls = mdp.rollout(self.policy, num_samples, greedy=False, generator=gen)
            named.update({f"policy_sample{k}": p for k, p in enumerate(rolls.placements)})
        failed: dict[str, str] = {}
        if mode == "safe":
            plans, failed = heuristic_candidates(task, mdp.single_compute_ms)
            named.update(plans)
            given = self.sources if sources is None else check_sources(sources)
            plans, no_plan = source_candidates(task, given, taken=list(named) + list(failed))
            named.update(plans)
            failed.update(no_plan)
        return named, failed

    def _place(self, task: Task, how: PlaceSettings) -> list[int]:
        mdp = self.mdp(task)
        if how.mode == "greedy":
            self.last_report = None
            placement = mdp.rollout(self.policy, 1, greedy=True).placements[0]
            return check_placement(task, [int(d) for d in placement])
        named, failed = self.candidates(task, how.mode, how.num_samples, how.seed, how.sources, mdp)
        large = is_large(task)
        self.last_report = choose(
            self.scorer(task, mdp.table_enc),
            named,
            failed,
            refine_top=1 if large else REFINE_TOP,
            refine_steps=REFINE_STEPS // 2 if large else REFINE_STEPS,
            seed=how.seed,
        )
        return check_placement(task, [int(d) for d in self.last_report.winner.placement])

    def single_compute_ms(self, task: Task) -> np.ndarray:
        """Predicted fwd + bwd (ms) of each table alone on a device, in table order."""
        return self.mdp(task).single_compute_ms

    @single_thread()
    @torch.no_grad()
    def predict(self, task: Task, placement: Sequence[int]) -> CostPrediction:
        """The cost network's per-device and overall cost of ``placement``."""
        placement = check_placement(task, placement)
        scorer = self.scorer(task)
        S, occupied = scorer.device_states(np.asarray([placement]))
        log_dev, log_step, std = scorer.device_stats(S, occupied)
        if not torch.isfinite(log_step[0]):
            raise ValueError("the cost network's prediction is not finite")
        dev = (torch.exp(log_dev[0]) * occupied[0].unsqueeze(-1)).numpy().astype(float)
        return CostPrediction(
            fwd_ms=dev[:, 0].tolist(),
            bwd_ms=dev[:, 1].tolist(),
            comm_ms=dev[:, 2].tolist(),
            step_ms=float(math.exp(float(log_step[0]))),
            step_log_std=float(std[0]),
        )

    @single_thread()
    @torch.no_grad()
    def table_costs(self, task: Task) -> np.ndarray:
        """Predicted single-table fwd + bwd + comm (ms) of each table, alone on a device."""
        single = alone_on_a_device(self.cost_net, task, self.inputs(task))[2]
        return single.sum(-1).numpy().astype(np.float64)
