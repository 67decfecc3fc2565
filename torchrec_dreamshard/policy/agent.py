"""The trained agent, :class:`DreamShard`: cost network, policy and metadata behind
``place``, ``predict`` and ``table_costs``."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from torchrec_dreamshard.cost_model import CostNet, device_context, single_thread
from torchrec_dreamshard.policy.mdp import EstimatedMDP
from torchrec_dreamshard.policy.network import PolicyNet
from torchrec_dreamshard.policy.search import REFINE_STEPS, refine
from torchrec_dreamshard.tables import table_features
from torchrec_dreamshard.tasks import Task, check_placement

BATCH_WARN_RATIO = 4.0  # warn when a task's batch is this far from the training batch


@dataclass
class CostPrediction:
    """The cost network's view of a placement (ms, scaled to the task's batch size).

    Attributes:
        fwd_ms: per device, forward (0 for an empty device).
        bwd_ms: per device, backward.
        comm_ms: per device, communication.
        step_ms: the overall head's step cost.
    """

    fwd_ms: list[float]
    bwd_ms: list[float]
    comm_ms: list[float]
    step_ms: float

    @property
    def total_ms(self) -> list[float]:
        """Per device ``fwd + bwd + comm``."""
        return [f + b + c for f, b, c in zip(self.fwd_ms, self.bwd_ms, self.comm_ms, strict=True)]


class DreamShard:
    """The trained agent: cost network, policy and metadata.

    Args:
        cost_net: the cost network.
        policy: the policy network (same hidden width).
        meta: metadata (hardware fingerprint, workload, batch size, version, ...).
    """

    def __init__(self, cost_net: CostNet, policy: PolicyNet, meta: dict[str, Any] | None = None):
        if cost_net.hidden != policy.hidden:
            raise ValueError(
                f"cost net width {cost_net.hidden} and policy width {policy.hidden} differ"
            )
        self.cost_net = cost_net.eval()
        self.policy = policy.eval()
        self.meta: dict[str, Any] = dict(meta or {})
        self.meta.setdefault("batch_size", 2048)
        self.meta.setdefault("hidden", cost_net.hidden)

    @classmethod
    def untrained(cls, seed: int = 0, hidden: int = 64) -> DreamShard:
        """Randomly initialised networks (deterministic in ``seed``)."""
        torch.manual_seed(seed)
        from torchrec_dreamshard import __version__

        meta = {"trained": False, "seed": seed, "version": __version__, "hidden": hidden}
        return cls(CostNet(hidden), PolicyNet(hidden), meta)

    # -- helpers --------------------------------------------------------------------------

    def features(self, task: Task) -> np.ndarray:
        """Table features at the batch size the networks were trained on."""
        return table_features(task.tables, int(self.meta["batch_size"]))

    def batch_scale(self, task: Task) -> float:
        """Factor from the trained batch size's milliseconds to the task's (linear in the
        batch; warns when the batch is far from the training one)."""
        ratio = task.batch_size / float(self.meta["batch_size"])
        if not 1 / BATCH_WARN_RATIO <= ratio <= BATCH_WARN_RATIO:
            warnings.warn(
                f"task batch size {task.batch_size} is far from the batch size "
                f"{self.meta['batch_size']} this agent was trained on; predicted costs are "
                "scaled linearly and may be off",
                stacklevel=3,
            )
        return ratio

    def mdp(self, task: Task) -> EstimatedMDP:
        """The task's estimated MDP."""
        return EstimatedMDP(self.cost_net, task, self.features(task))

    # -- public API -----------------------------------------------------------------------

    def place(
        self, task: Task, mode: str = "greedy", num_samples: int = 16, seed: int = 0
    ) -> list[int]:
        """A device per table, respecting every device's memory.

        Args:
            task: the task.
            mode: ``"greedy"`` (one argmax roll-out) or ``"search"`` (the greedy roll-out
                plus ``num_samples`` sampled ones; the one the cost network rates best,
                then improved by moves and swaps the cost network rates better, see
                :func:`refine`).
            num_samples: sampled roll-outs in search mode.
            seed: sampling seed.

        Raises:
            PlacementError: a table fits on no device (named in the message).
        """
        if mode not in ("greedy", "search"):
            raise ValueError(f"mode must be 'greedy' or 'search', got {mode!r}")
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        with single_thread():
            return self._place(task, mode, num_samples, seed)

    def _place(self, task: Task, mode: str, num_samples: int, seed: int) -> list[int]:
        mdp = self.mdp(task)
        best = mdp.rollout(self.policy, 1, greedy=True)
        placement, best_cost = best.placements[0], float(best.log_step[0])
        if mode == "search":
            gen = torch.Generator().manual_seed(seed)
            res = mdp.rollout(self.policy, num_samples, greedy=False, generator=gen)
            k = int(torch.argmin(res.log_step))
            if float(res.log_step[k]) < best_cost:
                placement = res.placements[k]
            placement = refine(mdp, np.asarray(placement), REFINE_STEPS, seed)
        return check_placement(task, [int(d) for d in placement])

    @single_thread()
    @torch.no_grad()
    def predict(self, task: Task, placement: Sequence[int]) -> CostPrediction:
        """The cost network's per-device and overall cost of ``placement``."""
        placement = check_placement(task, placement)
        D, H = task.num_devices, self.cost_net.hidden
        enc = self.cost_net.encode(torch.from_numpy(self.features(task)))
        S = torch.zeros(D, H).index_add(0, torch.tensor(placement), enc)
        occupied = torch.zeros(D, dtype=torch.bool)
        occupied[torch.tensor(placement)] = True
        ctx = device_context(D, sum(t.dim for t in task.tables))
        log_dev = self.cost_net.device_log_costs(S, ctx)
        log_step = self.cost_net.overall_log_cost(S, log_dev, occupied)
        scale = self.batch_scale(task)
        dev = (torch.exp(log_dev) * occupied.unsqueeze(-1)).numpy().astype(float) * scale
        return CostPrediction(
            fwd_ms=dev[:, 0].tolist(),
            bwd_ms=dev[:, 1].tolist(),
            comm_ms=dev[:, 2].tolist(),
            step_ms=float(torch.exp(log_step)) * scale,
        )

    @single_thread()
    @torch.no_grad()
    def table_costs(self, task: Task) -> np.ndarray:
        """Predicted single-table fwd + bwd + comm (ms) of each table, alone on a device."""
        return self.mdp(task).single_ms * self.batch_scale(task)
