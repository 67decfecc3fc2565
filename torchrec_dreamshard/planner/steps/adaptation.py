"""How a plan adapted to the machine, as one JSON-able record built from the planner's
settings, the plan's machine profile and the verification's verdict."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from torch import nn
from torchrec.distributed.planner.types import Topology

from torchrec_dreamshard.calibration import CalibrationConfig
from torchrec_dreamshard.calibration.auto import MachineCheck, check_machine
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.planner.stages.option_specs import OptionSpecs
from torchrec_dreamshard.planner.steps.plan_agent import AdaptSettings
from torchrec_dreamshard.policy.protocol import PlacementAgent
from torchrec_dreamshard.profile.machine_profile import MachineProfile
from torchrec_dreamshard.store.fed_inputs_store import recalled_inputs

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.planner.plans.loop_result import LastPlan
    from torchrec_dreamshard.planner.steps.verify_step import Verdict

FROM_JOB = "calibrating on the kernels observed in a running job"


def machine_check(profile: MachineProfile | None) -> MachineCheck | None:
    """The reference kernel, predicted against measured, as ``profile`` holds it."""
    if profile is None or profile.reference_predicted_ms is None:
        return None
    return MachineCheck(profile.reference_predicted_ms, profile.reference_ms)


def adaptation(
    settings: AdaptSettings,
    last: LastPlan,
    current: PlacementAgent,
    types: Any = None,
    given: bool = False,
) -> dict[str, Any]:
    """How the ``last`` plan adapted to this machine (what rank 0 sent, on another rank);
    ``types``: the proposer's ``TypePlan``; ``given``: the profile was the user's."""
    if last.sent is not None:
        return last.sent
    out = adapting(settings, last.profile, current, last.verdict)
    if last.recalled:
        out["inputs_from_job"] = list(last.recalled)
    if types is not None:
        out["types"] = types.to_dict()
    notes = list(last.verdict.notes) if last.verdict is not None else []
    return plan_adaptation(out, last.spent, last.profile, notes, given)


def adapting(
    settings: AdaptSettings,
    profile: MachineProfile | None,
    current: PlacementAgent,
    verdict: Verdict | None,
) -> dict[str, Any]:
    """Whether the plan calibrated and why, the reference kernel's error before and after,
    and what the verification measured and kept."""
    check = machine_check(profile)
    out: dict[str, Any] = {"mode": "auto" if settings.automatic else "on"}
    if settings.calibration is None:
        why = "verification only" if settings.verify_k else "calibrate=False"
        out.update(mode="off", why=why)
    elif settings.automatic and check is not None:
        out.update(check.to_dict(), why=check.why())
        if profile is not None and FROM_JOB in profile.notes:
            out["why"] += "; learning from the kernels observed in a running job"
    elif settings.automatic:
        out["why"] = "the reference kernel was not measured here: planning with the checkpoint"
    else:
        out["why"] = "calibrate was asked for"
    calibrated = profile is not None and profile.calibration is not None
    out["calibrated"] = calibrated
    if calibrated:
        out.update(profile.calibration.summary)
        if check is not None:
            out["reference_error_after"] = check_machine(current, check.measured_ms).error
    out.update(verdict.record() if verdict is not None else {"verified": False})
    out.setdefault("measure_failures", [])
    return out


def plan_adaptation(
    out: dict[str, Any],
    spent: dict[str, float] | None,
    profile: MachineProfile | None,
    notes: list[str],
    given: bool = False,
) -> dict[str, Any]:
    """``out`` with the seconds spent, the profile's summary, what was not measured and
    why, and the measurements that failed."""
    out = dict(out)
    if given:
        out["profile_given"] = True
    if spent is not None:
        out["spent_s"] = spent
    if profile is not None:
        out["profile"] = profile.summary()
        if profile.reference_ms is None and profile.notes and not given:
            out["why"] = profile.notes[0]  # nothing measured here, and why
        out["measuring_notes"] = [*profile.notes, *notes]
        failed = [dict(f) for f in profile.failures]
        out["measure_failures"] = [*failed, *out.get("measure_failures", [])]
    return out


def calibration_config(settings: AdaptSettings, topology: Topology) -> CalibrationConfig:
    """The calibration settings the planner calibrates with (or would), measuring nothing."""
    if settings.calibration is not None:
        base = settings.calibration
    else:
        device = "cuda" if topology.compute_device == "cuda" else "cpu"
        base = CalibrationConfig(measure=MeasureConfig(device=device))
    return dataclasses.replace(base, measure_missing=False, progress=False)


def recall_inputs(
    settings: AdaptSettings, topology: Topology, specs: OptionSpecs, module: nn.Module
) -> list[str]:
    """Where the planner calibrates, have ``specs`` take what running jobs fed ``module``'s
    tables (as the store keeps it); returns those tables."""
    if settings.calibration is None:
        return []
    store = calibration_config(settings, topology).store_path()
    pooling, reuse = recalled_inputs(store, module)
    specs.learn(pooling, reuse)
    return sorted(pooling)
