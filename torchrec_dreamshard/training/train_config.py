"""The training run's configuration and its seeding."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchrec_dreamshard.data.families import FAMILIES, TRAIN_FAMILIES


@dataclass(kw_only=True)
class TrainConfig:
    """Everything a training run depends on (saved in every checkpoint)."""

    out_dir: str = "runs/dreamshard"  # checkpoints, metrics.csv, curves.png
    store: str | None = None  # SQLite cost store (default: out_dir/costs.sqlite)
    seed: int = 0  # seeds the task draws, the networks and the roll-outs
    iterations: int = 4  # collect / fit / policy iterations N
    families: tuple[str, ...] = TRAIN_FAMILIES  # task families the run draws from
    optimizer: str = "rowwise_adagrad"  # the fused optimizer measured
    backend: str = "local"  # measurement backend: "local" or "distributed"
    measure_rounds: int = 3  # interleaved timing rounds per measurement
    measure_iters: int = 5  # timed iterations per round
    num_tables: tuple[int, int] | None = None  # T range of every task (None: the family's)
    num_devices: tuple[int, ...] | None = None  # D choices of every task (None: the family's)
    boot_single: int = 300  # single tables measured alone before iteration 0
    boot_subsets: int = 300  # random fused subsets (2..60 tables) on one device
    boot_tasks: int = 100  # tasks with random placements before iteration 0
    boot_placements: int = 2  # random placements per bootstrap task
    collect_tasks: int = 8  # tasks measured per iteration
    placements_per_task: int = 4  # safe plan, policy greedy, sampled..., random
    holdout_fraction: float = 0.2  # share of task groups kept out of the cost fit
    hidden: int = 16  # width of each cost-network member's table encodings
    members: int = 5  # cost-network ensemble size
    policy_hidden: int = 64  # width of the policy MLP
    cost_epochs: int = 300  # epochs of each cost fit
    cost_lr: float = 1e-2  # Adam learning rate of the cost fit
    policy_updates: int = 40  # REINFORCE updates per iteration (one fresh task each)
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
        unknown = sorted(set(self.families) - set(FAMILIES))
        if unknown or not self.families:
            raise ValueError(f"families must name some of {sorted(FAMILIES)}, got {unknown}")
        self.families = tuple(self.families)
        if self.num_tables is not None:
            self.num_tables = tuple(self.num_tables)
            if len(self.num_tables) != 2 or not 1 <= self.num_tables[0] <= self.num_tables[1]:
                raise ValueError(f"num_tables must be (low, high), got {self.num_tables}")
        if self.num_devices is not None:
            self.num_devices = tuple(self.num_devices)
            if not self.num_devices or min(self.num_devices) < 1:
                raise ValueError(f"num_devices must be positive, got {self.num_devices}")

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
