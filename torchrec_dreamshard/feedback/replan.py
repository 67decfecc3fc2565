"""Learning from the observed job, and planning again with what was learnt (rank 0).

0. **Inputs.** Where the job fed a table a pooling factor more than 10% off the one the
   planner was given (its ``ParameterConstraints.pooling_factors``, TorchRec's default 1.0
   where none was), the tables are taken as the job fed them from here on: pooling factors
   and reuse from the inputs recorded on the sampled steps (:mod:`.inputs`,
   :func:`job_inputs`).
1. **Store.** Each rank's fused embedding kernel, as measured in the job (forward and
   backward medians over the sampled steps), becomes a kernel row of the calibration store
   over the tables that rank holds, under the machine's and workload's key and an
   ``obs-`` job key (:data:`~torchrec_dreamshard.calibration.kernel_samples.OBSERVED`). A
   rank that also runs fused shards the cost network does not price (TorchRec placed them)
   is left out: its measured kernel is not the predicted one's.
2. **Learn.** The cost network is calibrated as at plan time (:func:`~torchrec_dreamshard.
   calibration.calibrate`), on the plan's tables: the isolated kernels already in the
   store and every observed kernel over these tables; it measures nothing, but where the
   job fed the tables other inputs than the planner was told (step 0: the store holds no
   kernel of the tables as fed), which it measures within the automatic calibration's
   budget, the other ranks serving. A restarted job's plan of the same tables learns from
   the observed kernels the same way. Then the job sets the level: the all-to-all head is
   scaled to the all-to-all time the job measured (:func:`comm_factor`) and the kernel
   heads to its fused kernels' (:func:`compute_factors`).
3. **Re-plan.** A planner built with the same arguments (the observed pooling factors and
   inputs in, after step 0) plans the model again with the updated network, free to choose
   sharding types and with each table held to the type it ran; the better rated of the two
   is compared with the observed plan, all priced by the updated network. The new plan is
   taken only where its predicted gain is larger than the network's uncertainty about
   either plan (the ensemble's spread of the log step cost); otherwise the observed plan
   stays.
4. **Memory.** Where the job's memory was measured (:mod:`.memory_report`), the ratio of
   each table's measured bytes to TorchRec's storage estimate becomes a
   :class:`~torchrec_dreamshard.cost.storage_correction.StorageCorrection` the re-plan
   plans with (``DreamShardPlanner(storage_correction=...)``): where the estimate was too
   small the new plan moves tables before a rank runs out, where too generous it may use
   the memory. Where the observed plan does not fit under the correction (a rank measured
   within the margin of its cap, or predicted beyond what the reservation leaves), the
   new plan is taken whatever its predicted speed.
"""

from __future__ import annotations

import collections
import itertools
import logging
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchrec_dreamshard.data.tables import TableSpec

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec.distributed.types import ShardingPlan

    from torchrec_dreamshard.feedback.inputs import ObservedInputs
    from torchrec_dreamshard.planner.plans.plan_prediction import PlanPrediction
    from torchrec_dreamshard.planner.plans.plan_record import PlanRecord
    from torchrec_dreamshard.planner.stages.perf_models import CostNetPerfModel
    from torchrec_dreamshard.policy import PlacementAgent

logger = logging.getLogger("torchrec_dreamshard.feedback")

MIN_GAIN = 0.01  # a re-plan must be predicted at least this much faster, whatever the spread


def rank_kernels(
    record: PlanRecord, spec_fn: Any = None
) -> tuple[list[list[TableSpec]], list[bool]]:
    """Per rank, the specs of the tables (and column shards) on the fused kernel that the
    cost network prices, and whether that is all the rank runs on the fused kernel.
    ``spec_fn`` gives each option's table spec (default: the planner's)."""
    from torchrec_dreamshard.planner.stages.option_kinds import is_policy_option, is_split_option
    from torchrec_dreamshard.planner.stages.option_specs import shard_specs

    spec_fn = spec_fn or record.specs
    world = record.topology.world_size
    groups: list[list[TableSpec]] = [[] for _ in range(world)]
    clean = [True] * world
    for option in record.best_options:
        if is_policy_option(option) or is_split_option(option):
            specs = shard_specs(option, spec_fn(option))
            for spec, shard in zip(specs, option.shards, strict=True):
                groups[shard.rank].append(spec)
        elif option.compute_kernel == "fused":
            for shard in option.shards:
                clean[shard.rank] = False
    return groups, clean


def store_observations(
    record: PlanRecord,
    measured: list[dict[str, float]],
    config: Any,
    kernels: tuple[list[list[TableSpec]], list[bool]],
) -> int:
    """Step 1: every clean rank's observed fused kernel (``kernels``: :func:`rank_kernels`)
    as a store row; how many."""
    from torchrec_dreamshard.cache.store_keys import job_prefix, table_signature
    from torchrec_dreamshard.calibration.kernel_samples import OBSERVED, store_kernel
    from torchrec_dreamshard.measure.config import stable_key
    from torchrec_dreamshard.store.cost_store import CostStore

    groups, clean = kernels
    batch = record.global_batch
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
        decision: JSON-able: gain, uncertainty, kernels learnt from, the storage
            correction learnt, why.
        options: the new plan's sharding options (rank 0), with the storage it was
            planned with.
    """

    plan: ShardingPlan
    changed: bool
    observed: PlanPrediction
    proposed: PlanPrediction
    decision: dict[str, Any]
    options: list[Any] | None = None


def perf_model(
    record: PlanRecord, agent: PlacementAgent, spec_fn: Any = None, other: float = 1.0
) -> CostNetPerfModel:
    """The planner's performance model, with ``agent``'s cost network (and ``spec_fn``'s
    table specs, default the planner's; TorchRec's estimates scaled by ``other``)."""
    from torchrec_dreamshard.planner.stages.perf_models import CostNetPerfModel

    spec_fn = spec_fn or record.specs
    return CostNetPerfModel(agent, record.topology, record.global_batch, spec_fn, other)


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


def job_inputs(
    record: PlanRecord, config: Any, inputs: ObservedInputs | None
) -> tuple[Any, dict[str, Any], Any]:
    """How the re-plan sees the tables: the observed plan's spec function, the planner
    arguments the new plan is made with, and the calibration settings. Where the job fed a
    table a pooling factor more than 10% off the one the planner was given
    (``ParameterConstraints.pooling_factors``, or TorchRec's default 1.0 where none was),
    the tables are what the job fed: pooling factors and reuse from the recorded inputs,
    and the kernels of these tables are measured as at plan time (the store holds none of
    them), within the automatic calibration's budget; the store keeps what the job fed for
    the next plan of these tables (a restarted job's). Else the planner's own view."""
    import dataclasses

    from torchrec_dreamshard.calibration.auto import AUTO_BUDGET_S
    from torchrec_dreamshard.planner.stages.option_specs import OptionSpecs

    if inputs is None or not inputs.mispriced():
        return record.specs, {}, config
    from torchrec_dreamshard.store.fed_inputs_store import remember_inputs

    batches = inputs.batches()
    model = record.planned_inputs[0]
    spec_fn = OptionSpecs(batches, record.topology.world_size)
    spec_fn.observe(model)
    spec_fn.learn(inputs.pooling_by_fqn(), {})
    remember_inputs(config.store_path(), model, inputs.fed(), spec_fn.reuse)
    arguments = {"constraints": inputs.constraints(), "sample_batches": batches or None}
    config = dataclasses.replace(config, measure_missing=True, budget_s=AUTO_BUDGET_S)
    return spec_fn, arguments, config


def other_factor(prediction: PlanPrediction, measured: list[dict[str, float]]) -> float:
    """How much more the shards TorchRec placed (data-parallel tables, row-wise shards and
    the like, which the planner rates with TorchRec's estimate) cost in the job than
    TorchRec estimates: the median over the ranks that hold some of measured / estimated,
    what a rank measured being its embedding part less what the cost network prices on it
    (1 without such ranks). TorchRec's estimates are built for GPUs: on a CPU they are off
    by orders of magnitude, which no step of the job would otherwise teach."""
    ratios = []
    for r, m in enumerate(measured):
        estimate = prediction.other_ms[r]
        ours = prediction.fwd_ms[r] + prediction.bwd_ms[r] + prediction.comm_ms[r]
        theirs = m.get("embedding_ms", 0.0) - ours
        if estimate > 0 and theirs > 0:
            ratios.append(theirs / estimate)
    return statistics.median(ratios) if ratios else 1.0


def compute_factors(
    prediction: PlanPrediction, measured: list[dict[str, float]], clean: list[bool]
) -> tuple[float, float]:
    """How much slower the job ran its fused kernels, forward and backward, than the
    calibrated network predicts: the median over the clean ranks (whose fused kernel is
    all the network's) of measured / predicted (1 without). Calibration fits the kernels
    timed alone; in the job they share the cores with the rest of the step and the other
    ranks, which slows every kernel alike: the job sets the level, the isolated kernels
    the differences between tables."""
    out = []
    for key, predicted in (("fwd_ms", prediction.fwd_ms), ("bwd_ms", prediction.bwd_ms)):
        ratios = [
            m[key] / p
            for m, p, ok in zip(measured, predicted, clean, strict=True)
            if ok and p > 0 and m.get(key, 0) > 0
        ]
        out.append(statistics.median(ratios) if ratios else 1.0)
    return out[0], out[1]


def learn_and_replan(
    record: PlanRecord,
    measured: list[dict[str, float]],
    config: Any,
    inputs: ObservedInputs | None = None,
    memory: dict[str, Any] | None = None,
) -> Replan:
    """Steps 1 to 4 (see the module docstring), on rank 0. ``inputs``: what the job fed
    its tables (:func:`job_inputs`); ``memory``: the job's memory report
    (:mod:`.memory_report`)."""
    from torchrec_dreamshard.calibration import calibrate, scale_comm, scale_compute
    from torchrec_dreamshard.feedback.memory_report import memory_correction
    from torchrec_dreamshard.planner.plans.plan_prediction import prediction_task

    spec_fn, arguments, config = job_inputs(record, config, inputs)
    correction, memory_bound = memory_correction(record, memory, arguments, inputs)
    arguments = {**arguments, **({"storage_correction": correction} if correction else {})}
    kernels = rank_kernels(record, spec_fn)
    stored = store_observations(record, measured, config, kernels)
    specs = list(itertools.chain.from_iterable(kernels[0]))
    if not specs:
        return _kept(
            record,
            measured,
            "the plan has no table-wise or column-wise table the cost network prices",
        )
    task = prediction_task(specs, record.topology.world_size, record.global_batch)
    result = calibrate(record.prior_agent, task, config)
    tuned = result.agent
    calibrated = perf_model(record, tuned, spec_fn).predict(record.best_options)
    factor = comm_factor(calibrated, measured)
    scale_comm(tuned.cost_net, factor)
    compute = compute_factors(calibrated, measured, kernels[1])
    scale_compute(tuned.cost_net, compute)
    other = other_factor(perf_model(record, tuned, spec_fn).predict(record.best_options), measured)
    rating = perf_model(record, tuned, spec_fn, other)
    observed = rating.predict(record.best_options)
    model, sharders = record.planned_inputs
    # two new plans: with the planner's choice of sharding types, and with each table's
    # type as observed (what the job measured; a type it did not run is priced by a model
    # the job did not check); the better rated, both priced as the observed plan is
    given = arguments.get("constraints", record.constraints)
    candidates = []
    for constraints in (given, observed_types(given, record.best_options)):
        fresh = record.replanner(tuned, **dict(arguments, constraints=constraints))
        plan = fresh.plan(model, sharders)
        candidates.append((rating.predict(fresh.best_options), plan, fresh))
    proposed, plan, fresh = min(candidates, key=lambda c: c[0].step_ms)
    gain = 1.0 - proposed.step_ms / observed.step_ms
    spread = max(observed.step_log_std, proposed.step_log_std, MIN_GAIN)
    changed = str(plan) != str(record.plan) and (gain > spread or memory_bound)
    decision = {
        "kernels_observed": stored,
        "comm_scale": factor,
        "compute_scale": list(compute),
        "other_scale": other,
        "kernels_learnt_from": result.samples,
        "kernels_measured": result.measured,
        "kernels_discarded": result.discarded,  # measured while the machine was busy
        "inputs_from_job": [t.fqn for t in inputs.mispriced()] if arguments else [],
        "reuse_from_job": sorted(spec_fn.reuse) if arguments else [],
        "observed_types": sharding_types(record.best_options),
        "proposed_types": sharding_types(fresh.best_options),
        "observed_predicted_ms": observed.step_ms,
        "proposed_predicted_ms": proposed.step_ms,
        "predicted_gain": gain,
        "uncertainty": spread,
        "changed": changed,
        "storage_correction": correction.to_dict() if correction is not None else None,
        "memory_bound": memory_bound,
        "why": _why(changed, gain, spread, memory_bound),
    }
    taken = (plan, fresh.best_options) if changed else (record.plan, None)
    return Replan(taken[0], changed, observed, proposed, decision, taken[1])


def _why(changed: bool, gain: float, spread: float, memory_bound: bool) -> str:
    """The re-plan's decision in words."""
    if changed and gain <= spread:
        return (
            "the observed plan does not fit the memory measured (a rank at or near its "
            f"cap): the new plan fits with the corrected storage (predicted gain {gain:.1%})"
        )
    if changed:
        return (
            f"the new plan is predicted {gain:.1%} faster, beyond the model's uncertainty "
            f"({spread:.1%})"
        )
    if memory_bound:
        return (
            "the observed plan does not fit the memory measured, and no other plan was "
            "found that fits with the corrected storage"
        )
    return f"no new plan pays: predicted gain {gain:.1%}, uncertainty {spread:.1%}"


def observed_types(given: dict[str, Any] | None, options: list[Any]) -> dict[str, Any]:
    """``given`` constraints with each planned table held to the sharding type and compute
    kernel it ran with (the user's other constraint fields kept)."""
    from torchrec_dreamshard.feedback.inputs import with_fields

    out = dict(given or {})
    for option in options:
        out[option.name] = with_fields(
            out.get(option.name),
            sharding_types=[option.sharding_type],
            compute_kernels=[option.compute_kernel],
        )
    return out


def sharding_types(options: list[Any]) -> dict[str, int]:
    """How many tables of a plan's options take each sharding type."""
    return dict(collections.Counter(o.sharding_type for o in options))


def _kept(record: PlanRecord, measured: list[dict[str, float]], why: str) -> Replan:
    """The observed plan, unchanged, for ``why``: only TorchRec's estimates learn the
    job's level (:func:`other_factor`)."""
    other = other_factor(record.prediction, measured)
    prediction = perf_model(record, record.agent, None, other).predict(record.best_options)
    decision = {
        "kernels_observed": 0,
        "other_scale": other,
        "changed": False,
        "why": f"nothing to learn for the cost network: {why}",
    }
    return Replan(record.plan, False, prediction, prediction, decision)


def replan_on_rank0(
    record: PlanRecord,
    measured: list[dict[str, float]],
    inputs: ObservedInputs | None,
    memory: dict[str, Any] | None = None,
) -> tuple[ShardingPlan, PlanPrediction, PlanPrediction, dict[str, Any], Any] | str:
    """:func:`learn_and_replan` with the record's calibration settings: the plan, the
    observed and proposed predictions and the decision (what rank 0 sends every rank),
    and the new plan's options (which rank 0 keeps), or the error's text (every rank
    raises it after the broadcast)."""
    try:
        out = learn_and_replan(record, measured, record.calibration, inputs, memory)
    except Exception as exc:  # every rank raises it after the broadcast
        logger.exception("re-planning failed")
        return f"{type(exc).__name__}: {exc}"
    logger.info("re-plan: %s", out.decision["why"])
    return out.plan, out.observed, out.proposed, out.decision, out.options
