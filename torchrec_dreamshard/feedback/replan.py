"""Learning from the observed job, and planning again with what was learnt (rank 0).

1. **Store.** Each rank's fused embedding kernel, as measured in the job (forward and
   backward medians over the sampled steps), becomes a kernel row of the calibration store
   over the tables that rank holds, under the machine's and workload's key and an
   ``obs-`` job key (:data:`~torchrec_dreamshard.calibration.kernel_samples.OBSERVED`). A rank that
   also runs fused shards the cost network does not price (TorchRec placed them) is left
   out: its measured kernel is not the predicted one's.
2. **Learn.** The cost network is calibrated as at plan time (:func:`~torchrec_dreamshard.
   calibration.calibrate`, measuring nothing), on the plan's tables: the isolated kernels
   already in the store and every observed kernel over these tables. A restarted job's
   plan of the same tables learns from them the same way.
   The all-to-all head is scaled to what the job measured (:func:`comm_factor`).
3. **Re-plan.** A planner built with the same arguments plans the model again with the
   updated network; the updated network also prices the observed plan. The new plan is
   taken only where its predicted gain is larger than the network's uncertainty about
   either plan (the ensemble's spread of the log step cost); otherwise the observed plan
   stays.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchrec_dreamshard.data.tables import TableSpec

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec.distributed.types import ShardingPlan

    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.planner.perf_models import CostNetPerfModel
    from torchrec_dreamshard.planner.proposal import PlanPrediction
    from torchrec_dreamshard.policy import PlacementAgent

MIN_GAIN = 0.01  # a re-plan must be predicted at least this much faster, whatever the spread


def rank_kernels(planner: DreamShardPlanner) -> tuple[list[list[TableSpec]], list[bool]]:
    """Per rank, the specs of the tables (and column shards) on the fused kernel that the
    cost network prices, and whether that is all the rank runs on the fused kernel."""
    from torchrec_dreamshard.planner.proposal import is_policy_option, is_split_option, option_specs

    world = planner.topology.world_size
    groups: list[list[TableSpec]] = [[] for _ in range(world)]
    clean = [True] * world
    for option in planner.best_options:
        if is_policy_option(option) or is_split_option(option):
            specs = option_specs(option, planner.table_specs(option))
            for spec, shard in zip(specs, option.shards, strict=True):
                groups[shard.rank].append(spec)
        elif option.compute_kernel == "fused":
            for shard in option.shards:
                clean[shard.rank] = False
    return groups, clean


def store_observations(
    planner: DreamShardPlanner, measured: list[dict[str, float]], config: Any
) -> int:
    """Step 1: every clean rank's observed fused kernel as a store row; how many."""
    from torchrec_dreamshard.calibration.kernel_samples import OBSERVED, store_kernel
    from torchrec_dreamshard.calibration.store_keys import job_prefix, table_signature
    from torchrec_dreamshard.measure.config import stable_key
    from torchrec_dreamshard.measure.store import CostStore

    groups, clean = rank_kernels(planner)
    batch = planner.global_batch
    path = config.store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    stored = 0
    with CostStore(path) as store, store.collector_lock("dreamshard observe"):
        prefix = job_prefix(store, config.measure, batch)
        for r, tables in enumerate(groups):
            m = measured[r]
            if not (tables and clean[r] and m.get("fwd_ms", 0) > 0 and m.get("bwd_ms", 0) > 0):
                continue
            key = stable_key([sorted(table_signature(t) for t in tables), time.time_ns(), r])
            fb = (m["fwd_ms"], m["bwd_ms"])
            store_kernel(
                store, tables, batch, fb, 0.0, 0.0, config.measure, prefix + OBSERVED + key
            )
            stored += 1
    return stored


@dataclass
class Replan:
    """What :func:`learn_and_replan` decided.

    Attributes:
        plan: the plan to run (the observed one where a new one does not pay).
        changed: whether ``plan`` is a new plan.
        observed: the updated network's prediction of the observed plan.
        proposed: its prediction of the new plan.
        decision: JSON-able: gain, uncertainty, kernels learnt from, why.
    """

    plan: ShardingPlan
    changed: bool
    observed: PlanPrediction
    proposed: PlanPrediction
    decision: dict[str, Any]


def perf_model(planner: DreamShardPlanner, agent: PlacementAgent) -> CostNetPerfModel:
    """The planner's performance model, with ``agent``'s cost network."""
    from torchrec_dreamshard.planner.perf_models import CostNetPerfModel

    return CostNetPerfModel(agent, planner.topology, planner.global_batch, planner.table_specs)


def comm_factor(prediction: PlanPrediction, measured: list[dict[str, float]]) -> float:
    """How much more all-to-all the job measured than the network predicts: the median
    over ranks of measured / predicted all-to-all time (1 without both). The network's
    all-to-all head prices the pooled embeddings' exchange from the collectives measured
    in isolation; in the job the ids' input distribution is exchanged too, and the
    collectives share the cores with everything else."""
    ratios = [
        m["comm_ms"] / p
        for m, p in zip(measured, prediction.comm_ms, strict=True)
        if p > 0 and m.get("comm_ms", 0) > 0
    ]
    return statistics.median(ratios) if ratios else 1.0


def learn_and_replan(
    planner: DreamShardPlanner, measured: list[dict[str, float]], config: Any
) -> Replan:
    """Steps 1 to 3 (see the module docstring), on rank 0."""
    from torchrec_dreamshard.calibration import calibrate, scale_comm
    from torchrec_dreamshard.planner.proposal import prediction_task

    stored = store_observations(planner, measured, config)
    groups, _ = rank_kernels(planner)
    specs = list(itertools.chain.from_iterable(groups))
    if not specs:
        return _kept(
            planner, "the plan has no table-wise or column-wise table the cost network prices"
        )
    task = prediction_task(specs, planner.topology.world_size, planner.global_batch)
    result = calibrate(planner.prior_agent, task, config)
    tuned = result.agent
    factor = comm_factor(perf_model(planner, tuned).predict(planner.best_options), measured)
    scale_comm(tuned.cost_net, factor)
    observed = perf_model(planner, tuned).predict(planner.best_options)
    fresh = planner.replanner(tuned)
    model, sharders = planner.planned_inputs
    plan = fresh.plan(model, sharders)
    proposed = fresh.last_prediction
    gain = 1.0 - proposed.step_ms / observed.step_ms
    spread = max(observed.step_log_std, proposed.step_log_std, MIN_GAIN)
    changed = str(plan) != str(planner.last_plan) and gain > spread
    decision = {
        "kernels_observed": stored,
        "comm_scale": factor,
        "kernels_learnt_from": result.samples,
        "observed_predicted_ms": observed.step_ms,
        "proposed_predicted_ms": proposed.step_ms,
        "predicted_gain": gain,
        "uncertainty": spread,
        "changed": changed,
        "why": (
            f"the new plan is predicted {gain:.1%} faster, beyond the model's uncertainty "
            f"({spread:.1%})"
            if changed
            else f"no new plan pays: predicted gain {gain:.1%}, uncertainty {spread:.1%}"
        ),
    }
    return Replan(plan if changed else planner.last_plan, changed, observed, proposed, decision)


def _kept(planner: DreamShardPlanner, why: str) -> Replan:
    """The observed plan, unchanged, for ``why``."""
    prediction = planner.last_prediction
    decision = {"kernels_observed": 0, "changed": False, "why": f"nothing to learn: {why}"}
    return Replan(planner.last_plan, False, prediction, prediction, decision)
