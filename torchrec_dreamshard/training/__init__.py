"""The DreamShard training loop (:func:`~torchrec_dreamshard.training.loop.train`) and its
parts: config, collection jobs, cost samples, REINFORCE and metrics."""

from torchrec_dreamshard.training.collection_jobs import (
    Job,
    bootstrap_jobs,
    collect,
    draw_tasks,
    iteration_jobs,
    job_group,
    job_seed,
    placement_for,
)
from torchrec_dreamshard.training.logs import METRICS_NAME, PLOT_NAME, plot_curves, write_metrics
from torchrec_dreamshard.training.loop import CHECKPOINT_NAME, agent_meta, resume_agent, train
from torchrec_dreamshard.training.reinforce import (
    greedy_predicted_ms,
    reinforce_update,
    train_policy,
)
from torchrec_dreamshard.training.samples import load_samples, split_holdout
from torchrec_dreamshard.training.train_config import TrainConfig, seed_everything

__all__ = [
    "CHECKPOINT_NAME",
    "METRICS_NAME",
    "PLOT_NAME",
    "Job",
    "TrainConfig",
    "agent_meta",
    "bootstrap_jobs",
    "collect",
    "draw_tasks",
    "greedy_predicted_ms",
    "iteration_jobs",
    "job_group",
    "job_seed",
    "load_samples",
    "placement_for",
    "plot_curves",
    "reinforce_update",
    "resume_agent",
    "seed_everything",
    "split_holdout",
    "train",
    "train_policy",
    "write_metrics",
]
