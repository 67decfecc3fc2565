"""Learning from the observed job and planning again with it, on rank 0: tables taken as fed,
clean ranks' kernels stored, the cost network calibrated and scaled to the job's level, a new
plan kept only beyond the ensemble's spread or where the old one does not fit the memory."""

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
    """Per rank, the specs on the fused kernel the cost network prices, and whether that is
    all the rank runs on the fused kernel (``clean``)."""
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
    """Store every clean rank's observed fused kernel as a kernel row; returns how many."""
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
        decision: JSON-able: gain, uncertainty, kernels learnt from, correction, why.
        options: the new plan's sharding options (rank 0).
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
    """The planner's performance model with ``agent``'s network, TorchRec's estimates
    scaled by ``other``."""
    from torchrec_dreamshard.planner.stages.perf_models import CostNetPerfModel

    spec_fn = spec_fn or record.specs
    return CostNetPerfModel(agent, record.topology, record.global_batch, spec_fn, other)


def comm_factor(prediction: PlanPrediction, measured: list[dict[str, float]]) -> float:
    """The median over ranks of measured / predicted all-to-all ms (1 without both)."""
    ratios = [
        m["comm_ms"] / p
        for m, p in zip(measured, prediction.comm_ms, strict=True)
        if p > 0 and m.get("comm_ms", 0) > 0
    ]
    return statistics.median(ratios) if ratios else 1.0


def job_inputs(
    record: PlanRecord, config: Any, inputs: ObservedInputs | None
) -> tuple[Any, dict[str, Any], Any]:
    """How the re-plan sees the tables: ``(spec_fn, planner arguments, calibration config)``.

    Where :meth:`ObservedInputs.mispriced` names tables, they are taken as the job fed them,
    their kernels measured within the automatic budget and the inputs remembered in the
    store; else the planner's own view.
    """
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
    """The median over ranks of measured / TorchRec-estimated ms of the shards TorchRec
    placed (a rank's embedding time less what the network prices; 1 without such ranks)."""
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
    """``(fwd, bwd)`` medians over clean ranks of measured / predicted fused-kernel ms (1
    without): the job sets the level, the isolated kernels the differences between tables."""
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
    """Learn from the job and plan again (the module docstring's steps), on rank 0.

    Args:
        record: the observed plan's record.
        measured: per rank, the job's ``fwd_ms``, ``bwd_ms``, ``comm_ms`` and ``embedding_ms``.
        config: calibration settings.
        inputs: what the job fed its tables.
        memory: the job's memory report (:mod:`.memory_report`).
    """
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
    # two new plans, free and with the observed types (a type not run is priced unchecked)
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
    """``given`` constraints with each table held to the sharding type and kernel it ran."""
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
    """The observed plan, unchanged; only TorchRec's estimates learn the job's level."""
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
    """:func:`learn_and_replan` as the tuple rank 0 broadcasts, or the error's text."""
    try:
        out = learn_and_replan(record, measured, record.calibration, inputs, memory)
    except Exception as exc:  # every rank raises it after the broadcast
        logger.exception("re-planning failed")
        return f"{type(exc).__name__}: {exc}"
    logger.info("re-plan: %s", out.decision["why"])
    return out.plan, out.observed, out.proposed, out.decision, out.options
