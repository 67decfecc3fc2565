"""The DreamShard training loop.

Reads top to bottom like CleanRL's ``ppo.py``: a config dataclass, a seeding block, then
for each iteration

1. **collect**: sample training tasks, place them with the current agent (its greedy
   roll-out, sampled roll-outs and a random placement, so the cost network sees good and
   bad placements of the same task) and measure every placement on real kernels through
   :func:`torchrec_dreamshard.measure.measure_placement`, appending each to the SQLite
   cost store;
2. **fit** the cost network on every measurement of this hardware and workload (a fixed
   share of tasks held out for the metrics);
3. **train the policy** with REINFORCE on the estimated MDP of fresh training tasks (no
   hardware touched);
4. write metrics (CSV and a PNG of the curves) and a checkpoint.

Before the first iteration a bootstrap collects single tables and random fused subsets on
one device (the single-table costs that order the MDP and the sub-additivity of fusion)
and random placements. Every measurement carries a job key, so a killed run resumes from
its last checkpoint and skips what the store already holds.
"""

from __future__ import annotations

import csv
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from torchrec_dreamshard.cost_fit import (
    CostSample,
    evaluate_cost_model,
    fit_cost_model,
    sample_from_measurement,
)
from torchrec_dreamshard.cost_model import CostNet, single_thread
from torchrec_dreamshard.policy import DreamShard, PolicyNet
from torchrec_dreamshard.pool import CPU_POOL_SCALE, synthetic_pool
from torchrec_dreamshard.sampler import DEFAULT_MEMORY_FACTOR, TaskSampler, make_task
from torchrec_dreamshard.tasks import Task

CHECKPOINT_NAME = "checkpoint.pt"
METRICS_NAME = "metrics.csv"
PLOT_NAME = "curves.png"


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


# ----------------------------------------------------------------------------------------
# Collection
# ----------------------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_sampler(cfg: TrainConfig) -> TaskSampler:
    """The task sampler over the configured pool (its split is fixed by ``pool_seed``)."""
    return TaskSampler(synthetic_pool(scale=cfg.pool_scale, seed=cfg.pool_seed), seed=cfg.pool_seed)


def bootstrap_jobs(cfg: TrainConfig, sampler: TaskSampler) -> list[tuple[str, Task, str]]:
    """``(job, task, how)`` of the bootstrap: single tables, fused subsets, random
    placements (deterministic in the config)."""
    rng = np.random.default_rng([cfg.seed, 7919])
    train = sampler.splits["train"]
    jobs = []
    for j, i in enumerate(rng.choice(len(train), min(cfg.boot_single, len(train)), False)):
        jobs.append((f"boot-single-{j}", make_task([train[i]], 1, cfg.batch_size), "one"))
    for j in range(cfg.boot_subsets):
        n = int(rng.integers(2, min(40, len(train)) + 1))
        chosen = [train[i] for i in sorted(rng.choice(len(train), n, False))]
        jobs.append((f"boot-subset-{j}", make_task(chosen, 1, cfg.batch_size), "one"))
    tasks = draw_tasks(cfg, sampler, cfg.boot_tasks, rng)
    for j, task in enumerate(tasks):
        for k in range(cfg.placements_per_task):
            jobs.append((f"boot-task{j}-{k}", task, f"random:{k}"))
    return jobs


def draw_tasks(
    cfg: TrainConfig, sampler: TaskSampler, n: int, rng: np.random.Generator
) -> list[Task]:
    """``n`` training tasks drawn with ``rng`` (the sampler's own RNG is left alone)."""
    sampler.rng = np.random.default_rng(rng.integers(2**63))
    return [
        sampler.sample(
            "train", cfg.num_tables, list(cfg.num_devices), cfg.batch_size, cfg.memory_factor
        )
        for _ in range(n)
    ]


def iteration_jobs(cfg: TrainConfig, sampler: TaskSampler, it: int) -> list[tuple[str, Task, str]]:
    """Iteration ``it``'s jobs: per task the greedy roll-out, sampled ones, a random one."""
    rng = np.random.default_rng([cfg.seed, it])
    jobs = []
    for j, task in enumerate(draw_tasks(cfg, sampler, cfg.collect_tasks, rng)):
        for k in range(cfg.placements_per_task):
            last = k == cfg.placements_per_task - 1 and k > 0
            how = "greedy" if k == 0 else ("random" if last else "sample")
            jobs.append((f"it{it}-task{j}-{k}", task, f"{how}:{k}"))
    return jobs


def placement_for(agent: DreamShard, task: Task, how: str, seed: int) -> list[int]:
    """The placement a job measures (``how`` is ``kind:k``)."""
    from torchrec_dreamshard.measure import random_placement

    kind, k = how.split(":") if ":" in how else (how, "0")
    if kind == "one":
        return [0] * len(task.tables)
    if kind == "random":
        return random_placement(task, seed + int(k))
    if kind == "greedy":
        return agent.place(task)
    mdp = agent.mdp(task)
    gen = torch.Generator().manual_seed(seed + int(k))
    with single_thread():
        return [int(d) for d in mdp.rollout(agent.policy, 1, False, gen).placements[0]]


def collect(
    agent: DreamShard, jobs: list[tuple[str, Task, str]], store: Any, cfg: TrainConfig
) -> dict[str, float]:
    """Measure every job the store does not hold yet; returns collection metrics."""
    from torchrec_dreamshard.measure import measure_placement

    mcfg = cfg.measure_config()
    prefix = jobs[0][0].split("-")[0] if jobs else ""
    done = store.done_jobs(prefix)
    todo = [j for j in jobs if j[0] not in done]
    greedy_ms, start = [], time.perf_counter()
    for job, task, how in _bar(todo, cfg.progress, f"measure {prefix}"):
        seed = cfg.seed * 1000 + (abs(hash(job)) % 1000)
        placement = placement_for(agent, task, how, seed)
        m = measure_placement(task, placement, mcfg, backend=cfg.backend)
        store.append(task, placement, m, mcfg, job=job)
        if how.startswith("greedy") and m.ok:
            greedy_ms.append(m.step_ms)
    out = {"collect/measured": float(len(todo)), "collect/wall_s": time.perf_counter() - start}
    if greedy_ms:
        out["plan/cost_ms"] = float(np.mean(greedy_ms))
    return out


def _bar(items, enabled: bool, desc: str):
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, leave=False)


# ----------------------------------------------------------------------------------------
# Cost network
# ----------------------------------------------------------------------------------------


def load_samples(store: Any, cfg: TrainConfig) -> list[CostSample]:
    """Every successful measurement of this run's workload as cost samples.

    Compute figures are normalised to the machine's typical speed (times the median
    reference-kernel time over the row's own); the all-to-all is left as measured or
    modelled (the reference kernel says nothing about it); the step cost is recomputed
    as ``max_d (fwd + bwd + comm)``.
    """
    workload = cfg.measure_config().workload_key(cfg.batch_size)
    examples = store.placement_examples(workload=workload, normalise=False)
    refs = [ex.reference_ms for ex in examples if math.isfinite(ex.reference_ms)]
    typical = float(np.median(refs)) if refs else 1.0
    out = []
    for ex in examples:
        scale = typical / ex.reference_ms if math.isfinite(ex.reference_ms) else 1.0
        job = ex.meta.get("job") or f"row{ex.meta.get('id')}"
        group = job.rsplit("-", 1)[0] if "-task" in job else job
        per_device = [(d.fwd_ms * scale, d.bwd_ms * scale, d.comm_ms) for d in ex.per_device]
        step = max(sum(d) for d in per_device)
        tables, D, B = ex.task.tables, ex.task.num_devices, ex.task.batch_size
        out.append(sample_from_measurement(group, tables, ex.placement, D, B, per_device, step))
    return out


def split_holdout(
    samples: list[CostSample], fraction: float, seed: int
) -> tuple[list[CostSample], list[CostSample]]:
    """Split by task group: a group (all placements of one task) is wholly in or out."""
    groups = sorted({s.group for s in samples if "-task" in s.group})
    rng = np.random.default_rng([seed, 104729])
    held = set(rng.choice(groups, int(round(fraction * len(groups))), False)) if groups else set()
    return [s for s in samples if s.group not in held], [s for s in samples if s.group in held]


# ----------------------------------------------------------------------------------------
# Policy: REINFORCE on the estimated MDP
# ----------------------------------------------------------------------------------------


def reinforce_update(
    agent: DreamShard,
    task: Task,
    opt: torch.optim.Optimizer,
    rollouts: int,
    entropy_coef: float,
    generator: torch.Generator,
) -> dict[str, float]:
    """One REINFORCE step on ``task``'s estimated MDP.

    ``R_k = -log step_hat_k`` of ``K`` sampled roll-outs, normalised across them,
    ``A_k = (R_k - mean R) / (std R + 1e-6)``; the loss is
    ``-mean_k A_k sum_t log pi(a_tk | s_tk) - c * mean_t,k H(pi(. | s_tk))``.
    """
    mdp = agent.mdp(task)
    roll = mdp.rollout(agent.policy, rollouts, greedy=False, generator=generator, record=True)
    ret = -roll.log_step
    adv = (ret - ret.mean()) / (ret.std() + 1e-6)
    logits = agent.policy(roll.inputs).masked_fill(~roll.legal, float("-inf"))
    logp = F.log_softmax(logits, dim=-1)
    chosen = logp.gather(-1, roll.actions.unsqueeze(-1)).squeeze(-1).sum(0)
    safe = logp.masked_fill(~roll.legal, 0.0)
    entropy = -(safe.exp() * safe).sum(-1).mean()
    loss = -(adv * chosen).mean() - entropy_coef * entropy
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(agent.policy.parameters(), 1.0)
    opt.step()
    return {
        "losses/policy": loss.item(),
        "losses/entropy": entropy.item(),
        "policy/pred_cost_ms": float(torch.exp(roll.log_step).mean()),
    }


def train_policy(
    agent: DreamShard, tasks: list[Task], cfg: TrainConfig, it: int
) -> dict[str, float]:
    """REINFORCE over ``tasks`` (one update each); returns mean metrics."""
    opt = torch.optim.Adam(agent.policy.parameters(), lr=cfg.policy_lr)
    gen = torch.Generator().manual_seed(cfg.seed * 7919 + it)
    agent.policy.train()
    rows = []
    with single_thread():
        for task in _bar(tasks, cfg.progress, "policy"):
            rows.append(
                reinforce_update(agent, task, opt, cfg.policy_rollouts, cfg.entropy_coef, gen)
            )
    agent.policy.eval()
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]} if rows else {}


@torch.no_grad()
def greedy_predicted_ms(agent: DreamShard, tasks: list[Task]) -> float:
    """Geometric mean of the cost network's step cost for the greedy placements."""
    logs = [math.log(agent.predict(t, agent.place(t)).step_ms) for t in tasks]
    return float(math.exp(np.mean(logs)))


# ----------------------------------------------------------------------------------------
# Checkpoints, metrics
# ----------------------------------------------------------------------------------------


def agent_meta(cfg: TrainConfig, store: Any, n_samples: int, wall_s: float) -> dict[str, Any]:
    """What a checkpoint records about its data."""
    from torchrec_dreamshard import __version__
    from torchrec_dreamshard.measure import hardware_fingerprint

    mcfg = cfg.measure_config()
    return {
        "trained": True,
        "version": __version__,
        "batch_size": cfg.batch_size,
        "hidden": cfg.hidden,
        "hardware": hardware_fingerprint(mcfg),
        "workload": mcfg.workload(cfg.batch_size),
        "workload_key": mcfg.workload_key(cfg.batch_size),
        "pool": {"kind": "synthetic", "scale": cfg.pool_scale, "seed": cfg.pool_seed},
        "train_tasks": {"num_tables": list(cfg.num_tables), "num_devices": list(cfg.num_devices)},
        "measurements": int(store.count(workload=mcfg.workload_key(cfg.batch_size), ok=True)),
        "cost_samples": n_samples,
        "train_wall_s": round(wall_s, 1),
        **cfg.extra_meta,
    }


def write_metrics(out_dir: Path, row: dict[str, float]) -> None:
    """Append ``row`` to metrics.csv (the header grows with new keys) and redraw curves."""
    path = out_dir / METRICS_NAME
    rows = list(csv.DictReader(path.open())) if path.exists() else []
    rows.append({k: str(v) for k, v in row.items()})
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    plot_curves(path, out_dir / PLOT_NAME)


def plot_curves(metrics_csv: Path, out_png: Path) -> None:
    """One panel per metric against the iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(csv.DictReader(Path(metrics_csv).open()))
    keys = [k for k in rows[0] if k != "iteration"] if rows else []
    if not keys:
        return
    cols = 3
    fig, axes = plt.subplots(
        math.ceil(len(keys) / cols), cols, figsize=(12, 2.6 * math.ceil(len(keys) / cols))
    )
    for ax, key in zip(np.ravel(axes), keys, strict=False):
        pts = [(float(r["iteration"]), float(r[key])) for r in rows if r.get(key) not in ("", None)]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("iteration", fontsize=8)
    for ax in np.ravel(axes)[len(keys) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out_png, dpi=80)
    plt.close(fig)


def resume_agent(cfg: TrainConfig) -> tuple[DreamShard, int, float]:
    """The last checkpoint's agent, next iteration and wall time; a fresh agent if none."""
    from torchrec_dreamshard.checkpoint import load_checkpoint, read_payload

    path = Path(cfg.out_dir) / CHECKPOINT_NAME
    if not path.exists():
        torch.manual_seed(cfg.seed)
        agent = DreamShard(CostNet(cfg.hidden), PolicyNet(cfg.hidden), {"hidden": cfg.hidden})
        return agent, 0, 0.0
    extra = read_payload(path)["extra"]
    saved = extra.get("config", {})
    for key in ("seed", "pool_seed", "pool_scale", "batch_size", "optimizer", "hidden"):
        if key in saved and saved[key] != getattr(cfg, key):
            raise ValueError(
                f"{path} was trained with {key}={saved[key]!r}, this run asks for "
                f"{getattr(cfg, key)!r}: use another --out-dir or the same settings"
            )
    return load_checkpoint(path), int(extra["iteration"]), float(extra.get("wall_s", 0.0))


# ----------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------


def train(cfg: TrainConfig) -> DreamShard:
    """Run (or resume) the DreamShard loop; returns the final agent.

    Every iteration ends with ``out_dir/checkpoint.pt`` (and a numbered copy), a row in
    ``metrics.csv`` and ``curves.png``.
    """
    from torchrec_dreamshard.checkpoint import save_checkpoint
    from torchrec_dreamshard.measure import CostStore

    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(asdict(cfg), indent=1) + "\n")
    # -- seeding ---------------------------------------------------------------------------
    seed_everything(cfg.seed)
    sampler = make_sampler(cfg)
    agent, start_it, wall_before = resume_agent(cfg)
    t0 = time.perf_counter()
    eval_tasks = draw_tasks(cfg, sampler, 8, np.random.default_rng([cfg.seed, 31337]))
    with CostStore(cfg.store_path) as store:
        if start_it == 0:
            collect(agent, bootstrap_jobs(cfg, sampler), store, cfg)
        for it in range(start_it, cfg.iterations):
            row: dict[str, float] = {"iteration": it + 1}
            # -- 1. collect measured placements with the current agent ---------------------
            if it > 0 or cfg.collect_tasks:
                row.update(collect(agent, iteration_jobs(cfg, sampler, it), store, cfg))
            # -- 2. fit the cost network ------------------------------------------------------
            samples = load_samples(store, cfg)
            fit_set, held = split_holdout(samples, cfg.holdout_fraction, cfg.seed)
            with single_thread():
                # refit from scratch on all the data: warm-started refits on a slowly
                # growing set overfit it (held-out MAPE rose from 10% to 25% in 4 refits)
                torch.manual_seed(cfg.seed + it)
                agent.cost_net = CostNet(cfg.hidden)
                hist = fit_cost_model(
                    agent.cost_net, fit_set, cfg.cost_epochs, lr=cfg.cost_lr,
                    seed=cfg.seed + it, progress=cfg.progress,
                )  # fmt: skip
                row["losses/cost"] = hist[-1]
                row.update(evaluate_cost_model(agent.cost_net, held))
            # -- 3. train the policy on the estimated MDP -------------------------------------
            rng = np.random.default_rng([cfg.seed, it, 17])
            row.update(
                train_policy(agent, draw_tasks(cfg, sampler, cfg.policy_updates, rng), cfg, it)
            )
            row["plan/pred_cost_ms"] = greedy_predicted_ms(agent, eval_tasks)
            # -- 4. metrics and checkpoint ---------------------------------------------------
            wall = wall_before + time.perf_counter() - t0
            row["time/wall_s"] = wall
            row["data/samples"] = len(samples)
            agent.meta = agent_meta(cfg, store, len(samples), wall)
            extra = {"iteration": it + 1, "config": asdict(cfg), "wall_s": wall}
            save_checkpoint(agent, out_dir / CHECKPOINT_NAME, extra)
            save_checkpoint(agent, out_dir / f"checkpoint_it{it + 1:03d}.pt", extra)
            write_metrics(out_dir, row)
            if cfg.progress:
                print(json.dumps({k: round(v, 4) for k, v in row.items()}))
    return agent
