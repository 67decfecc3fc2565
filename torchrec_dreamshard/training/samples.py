"""The cost network's training data: the store's measurements as cost samples, and the
held-out split by task group."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from torchrec_dreamshard.cost.fitting import CostSample, sample_from_measurement
from torchrec_dreamshard.training.collection_jobs import is_task_group, job_group
from torchrec_dreamshard.training.train_config import TrainConfig

if TYPE_CHECKING:
    from torchrec_dreamshard.store.cost_store import CostStore


def load_samples(store: CostStore, cfg: TrainConfig) -> list[CostSample]:
    """Every successful measurement of this machine and run's workload as cost samples,
    compute normalised to the machine's typical speed by the reference kernel."""
    from torchrec_dreamshard.measure.hardware import fingerprint_key
    from torchrec_dreamshard.measure.summary import reference_scales

    mcfg = cfg.measure_config()
    fingerprint = fingerprint_key(store.fingerprint(mcfg, cfg.backend))  # this machine only
    suffix = mcfg.workload_key(1)[len("b1") :]  # "-rowwise_adagrad-fp32-cpu"
    examples = []
    for group in store.groups():
        if group["fingerprint"] == fingerprint and group["workload"].endswith(suffix):
            examples += store.placement_examples(fingerprint, group["workload"])
    scales = reference_scales([ex.reference_ms for ex in examples])
    out = []
    for ex, scale in zip(examples, scales, strict=True):
        job = ex.meta.get("job") or f"row{ex.meta.get('id')}"
        per_device = [(d.fwd_ms * scale, d.bwd_ms * scale, d.comm_ms) for d in ex.per_device]
        tables, D, B = ex.task.tables, ex.task.num_devices, ex.task.batch_size
        out.append(sample_from_measurement(job_group(job), tables, ex.placement, D, B, per_device))
    return out


def split_holdout(
    samples: list[CostSample], fraction: float, seed: int
) -> tuple[list[CostSample], list[CostSample]]:
    """Split by task group: a group (all placements of one task) is wholly in or out."""
    groups = sorted({s.group for s in samples if is_task_group(s.group)})
    rng = np.random.default_rng([seed, 104729])
    held = set(rng.choice(groups, int(round(fraction * len(groups))), False)) if groups else set()
    return [s for s in samples if s.group not in held], [s for s in samples if s.group in held]
