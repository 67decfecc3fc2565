"""The training run's configuration, its seeding and its task sampler."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from torchrec_dreamshard.pool import CPU_POOL_SCALE, synthetic_pool
from torchrec_dreamshard.sampler import DEFAULT_MEMORY_FACTOR, TaskSampler

if TYPE_CHECKING:
    pass


@dataclass(kw_only=True)
class TrainConfig:
    """Everything a training run depends on (saved in every checkpoint)."""

    out_dir: str = "runs/dreamshard"  # checkpoints, metrics.csv, curves.png
    store: str | None = None  # SQLite cost store (default: out_dir/costs.sqlite)
    seed: int = 0  # seeds the task draws, the networks and the roll-outs
    iterations: int = 8  # collect / fit / policy iterations N
    pool_scale: float = CPU_POOL_SCALE  # row scale of the synthetic DLRM-shaped pool
    pool_seed: int = 0  # the pool and its train/test split
    batch_size: int = 2048  # global batch of every measured kernel
    optimizer: str = "rowwise_adagrad"  # the fused optimizer measured
    backend: str = "local"  # measurement backend: "local" or "distributed"
    measure_rounds: int = 3  # interleaved timing rounds per measurement
    measure_iters: int = 5  # timed iterations per round
    num_tables: tuple[int, int] = (20, 60)  # T range of training tasks
    num_devices: tuple[int, ...] = (2, 4)  # D choices of training tasks
    memory_factor: float = DEFAULT_MEMORY_FACTOR  # device memory / (task bytes / D)
    boot_single: int = 512  # single tables measured alone before iteration 0 (capped at the split)
    boot_subsets: int = 200  # random fused subsets (2..40 tables) on one device
    boot_tasks: int = 12  # tasks with random placements before iteration 0
    collect_tasks: int = 6  # tasks measured per iteration
    placements_per_task: int = 4  # greedy, sampled..., random (K = tasks x this)
    holdout_fraction: float = 0.2  # share of task groups kept out of the cost fit
    hidden: int = 64  # width of both networks
    cost_epochs: int = 300  # epochs of each cost fit
    cost_lr: float = 1e-2  # Adam learning rate of the cost fit
    policy_updates: int = 60  # REINFORCE updates per iteration (one fresh task each)
    policy_rollouts: int = 16  # roll-outs per update (returns normalised across them)
    policy_lr: float = 1e-3  # Adam learning rate of the policy
    entropy_coef: float = 0.01  # entropy bonus
    progress: bool = True  # tqdm bars
    extra_meta: dict[str, Any] = field(default_factory=dict)  # copied into the checkpoint

    def __post_init__(self) -> None:
        if self.iterations < 0:
            raise ValueError(f"iterations must be >= 0, got {self.iterations}")
        if self.backend not in ("local", "distributed"):
            raise ValueError(f"backend must be 'local' or 'distributed', got {self.backend!r}")
        if not 0 <= self.holdout_fraction < 1:
            raise ValueError(f"holdout_fraction must be in [0, 1), got {self.holdout_fraction}")
        if self.placements_per_task < 1 or self.policy_rollouts < 2:
            raise ValueError("placements_per_task must be >= 1 and policy_rollouts >= 2")
        self.num_tables = tuple(self.num_tables)
        self.num_devices = tuple(self.num_devices)

    @property
    def store_path(self) -> Path:
        return Path(self.store) if self.store else Path(self.out_dir) / "costs.sqlite"

    def measure_config(self):
        from torchrec_dreamshard.measure import MeasureConfig

        return MeasureConfig(
            optimizer=self.optimizer,
            rounds=self.measure_rounds,
            iters=self.measure_iters,
            seed=self.seed,
        )


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_sampler(cfg: TrainConfig) -> TaskSampler:
    """The task sampler over the configured pool (its split is fixed by ``pool_seed``)."""
    return TaskSampler(synthetic_pool(scale=cfg.pool_scale, seed=cfg.pool_seed), seed=cfg.pool_seed)
