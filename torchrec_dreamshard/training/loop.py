"""The DreamShard training loop, top to bottom as CleanRL's ``ppo.py``: after a bootstrap,
each iteration collects measured placements, fits the cost network, trains the policy with
REINFORCE on the estimated MDP, and writes metrics and a checkpoint."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from torchrec_dreamshard.cost.cost_net import CostNet, single_thread
from torchrec_dreamshard.cost.fitting import evaluate_cost_model, fit_cost_model
from torchrec_dreamshard.io import atomic_write, dumps_strict
from torchrec_dreamshard.policy import CandidateSource, DreamShard
from torchrec_dreamshard.training.collection_jobs import (
    bootstrap_jobs,
    collect,
    draw_tasks,
    iteration_jobs,
)
from torchrec_dreamshard.training.logs import write_metrics
from torchrec_dreamshard.training.reinforce import greedy_predicted_ms, train_policy
from torchrec_dreamshard.training.samples import load_samples, split_holdout
from torchrec_dreamshard.training.train_config import TrainConfig, seed_everything
from torchrec_dreamshard.version import __version__

if TYPE_CHECKING:
    from torchrec_dreamshard.store.cost_store import CostStore


CHECKPOINT_NAME = "checkpoint.pt"


def agent_meta(cfg: TrainConfig, store: CostStore, n_samples: int, wall_s: float) -> dict[str, Any]:
    """What a checkpoint records about its data."""
    from torchrec_dreamshard.measure import hardware_fingerprint

    mcfg = cfg.measure_config()
    return {
        "trained": True,
        "version": __version__,
        "hidden": cfg.hidden,
        "members": cfg.members,
        "policy_hidden": cfg.policy_hidden,
        "hardware": hardware_fingerprint(mcfg, cfg.backend),
        "workload": {k: v for k, v in mcfg.workload(0).items() if k != "batch_size"},
        "train_families": list(cfg.families),
        "train_tasks": {
            "num_tables": list(cfg.num_tables or []) or "per family",
            "num_devices": list(cfg.num_devices or []) or "per family",
        },
        "measurements": n_samples,
        "cost_samples": n_samples,
        "train_wall_s": round(wall_s, 1),
        **cfg.extra_meta,
    }


def candidate_sources() -> tuple[CandidateSource, ...]:
    """The safe mode's candidate sources while training: the planner side's defaults."""
    from torchrec_dreamshard.planner.stages.candidates import default_sources

    return default_sources()


def new_agent(cfg: TrainConfig) -> DreamShard:
    """A fresh agent of the configured sizes (seeded by ``cfg.seed``)."""
    from torchrec_dreamshard.policy.policy_net import build_networks

    torch.manual_seed(cfg.seed)
    sizes = {"hidden": cfg.hidden, "members": cfg.members, "policy_hidden": cfg.policy_hidden}
    net, policy = build_networks(sizes)  # the one builder, as checkpoints are loaded
    return DreamShard(net, policy, sources=candidate_sources())


def resume_agent(cfg: TrainConfig) -> tuple[DreamShard, int, float]:
    """The last checkpoint's agent, next iteration and wall time; a fresh agent if none."""
    from torchrec_dreamshard.policy.checkpoint import load_checkpoint, read_payload

    path = Path(cfg.out_dir) / CHECKPOINT_NAME
    if not path.exists():
        return new_agent(cfg), 0, 0.0
    extra = read_payload(path)["extra"]
    saved = extra.get("config", {})
    for key in ("seed", "families", "optimizer", "hidden", "members", "policy_hidden"):
        mine = getattr(cfg, key)
        if key in saved and saved[key] != (list(mine) if isinstance(mine, tuple) else mine):
            raise ValueError(
                f"{path} was trained with {key}={saved[key]!r}, this run asks for "
                f"{getattr(cfg, key)!r}: use another --out-dir or the same settings"
            )
    agent = load_checkpoint(path, sources=candidate_sources())
    return agent, int(extra["iteration"]), float(extra.get("wall_s", 0.0))


def check_hardware(agent: DreamShard, store: CostStore, cfg: TrainConfig) -> None:
    """Check that a resumed run measures on the hardware, backend and protocol it started on.

    Raises:
        ValueError: a fingerprint field both record differs from this machine's.
    """
    saved = agent.meta.get("hardware")
    if not isinstance(saved, dict):
        return
    mine = store.fingerprint(cfg.measure_config(), cfg.backend)
    differ = sorted(k for k in saved.keys() & mine.keys() if saved[k] != mine[k])
    if differ:
        diffs = ", ".join(f"{k}: {saved[k]!r} there, {mine[k]!r} here" for k in differ)
        raise ValueError(
            f"{Path(cfg.out_dir) / CHECKPOINT_NAME} was trained on other hardware or "
            f"settings ({diffs}); use another --out-dir"
        )


def train(cfg: TrainConfig) -> DreamShard:
    """Run (or resume) the DreamShard loop.

    Every iteration writes ``out_dir/checkpoint.pt`` (and a numbered copy), a row of
    ``metrics.csv`` and ``curves.png``.

    Returns:
        The final agent.

    Example::

        agent = train(TrainConfig(out_dir="runs/cpu", iterations=10))
    """
    from torchrec_dreamshard.policy.checkpoint import save_checkpoint
    from torchrec_dreamshard.store import CostStore

    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / "config.json", dumps_strict(asdict(cfg)), "config file")
    # -- seeding ---------------------------------------------------------------------------
    seed_everything(cfg.seed)
    agent, start_it, wall_before = resume_agent(cfg)
    t0 = time.perf_counter()
    eval_tasks = draw_tasks(cfg, 8, np.random.default_rng([cfg.seed, 31337]))
    with CostStore(cfg.store_path) as store, store.collector_lock("dreamshard train"):
        check_hardware(agent, store, cfg)  # before any measuring
        if start_it == 0:
            collect(agent, bootstrap_jobs(cfg), store, cfg)
        for it in range(start_it, cfg.iterations):
            row: dict[str, float] = {"iteration": it + 1}
            # -- 1. collect measured placements with the current agent ---------------------
            if it > 0 or cfg.collect_tasks:
                row.update(collect(agent, iteration_jobs(cfg, it), store, cfg))
            # -- 2. fit the cost network ------------------------------------------------------
            samples = load_samples(store, cfg)
            fit_set, held = split_holdout(samples, cfg.holdout_fraction, cfg.seed)
            with single_thread():
                # refit from scratch on all the data (docs/design_notes.md)
                torch.manual_seed(cfg.seed + it)
                agent.cost_net = CostNet(cfg.hidden, cfg.members)
                hist = fit_cost_model(
                    agent.cost_net,
                    fit_set,
                    cfg.cost_epochs,
                    lr=cfg.cost_lr,
                    seed=cfg.seed + it,
                    progress=cfg.progress,
                )
                row["losses/cost"] = hist[-1]
                row.update(evaluate_cost_model(agent.cost_net, held))
            # -- 3. train the policy on the estimated MDP -------------------------------------
            rng = np.random.default_rng([cfg.seed, it, 17])
            row.update(train_policy(agent, draw_tasks(cfg, cfg.policy_updates, rng), cfg, it))
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
