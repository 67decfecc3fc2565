"""How a :class:`~torchrec_dreamshard.planner.planners.DreamShardPlanner`'s agent adapts to
the machine, read in one place: the calibrating agent it may be wrapped in
(:class:`~torchrec_dreamshard.calibration.CalibratingAgent`), the agent before adapting,
the calibration settings, and the tables' inputs recalled from a running job's store.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn
from torchrec.distributed.planner.types import Topology

from torchrec_dreamshard.calibration import CalibratingAgent, CalibrationConfig
from torchrec_dreamshard.calibration.fed_inputs_store import recalled_inputs
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.planner.stages.option_specs import OptionSpecs
from torchrec_dreamshard.policy.protocol import PlacementAgent
from torchrec_dreamshard.profile.machine_profile import MachineProfile


def calibrating(agent: PlacementAgent) -> CalibratingAgent | None:
    """``agent`` where it calibrates or verifies (a :class:`CalibratingAgent`), else
    ``None``."""
    return agent if isinstance(agent, CalibratingAgent) else None


def prior_agent(agent: PlacementAgent) -> PlacementAgent:
    """The agent before calibration (the checkpoint's)."""
    wrapper = calibrating(agent)
    return wrapper.prior if wrapper is not None else agent


def adaptation(agent: PlacementAgent, recalled: list[str], types: Any = None) -> dict[str, Any]:
    """How the last plan of ``agent`` adapted to this machine (JSON-able): whether it
    calibrated, why, the cost network's error before and after, the tables whose inputs it
    took from what a running job fed them (``recalled``: ``inputs_from_job``), and the
    type choice (``types``, the proposer's ``TypePlan``: each decision, its margin and
    what tipped it)."""
    wrapper = calibrating(agent)
    if wrapper is None:
        out: dict[str, Any] = {"mode": "off", "calibrated": False, "why": "calibrate=False"}
    else:
        out = wrapper.adaptation()
    if recalled:
        out["inputs_from_job"] = list(recalled)
    if types is not None:
        out["types"] = types.to_dict()
    return out


def plan_adaptation(
    out: dict[str, Any],
    spent: dict[str, float] | None,
    profile: MachineProfile | None,
    notes: list[str],
    given: bool = False,
) -> dict[str, Any]:
    """:func:`adaptation` of a plan (``out``) with what the plan spent its seconds on
    (``spent_s``: measuring the ``collectives``, the ``dense_kernel``, the
    ``sharding_path`` and the ``reference_kernel``, ``calibration``, ``verification``,
    each without what the others inside it took, and ``planning`` for the rest), the
    machine profile it planned from (``profile``), what was not measured and why
    (``measuring_notes``: the profile's and ``notes``, the verification's) and the
    measurements that failed (``measure_failures``); ``given``: the profile was the
    user's (``profile_given``), measured elsewhere or earlier."""
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


def calibration_config(agent: PlacementAgent, topology: Topology) -> CalibrationConfig:
    """The calibration settings ``agent`` calibrates with (or would, on ``topology``'s
    device), measuring nothing: the store the job's observations join."""
    wrapper = calibrating(agent)
    if wrapper is not None and wrapper.calibration is not None:
        base = wrapper.calibration
    else:
        device = "cuda" if topology.compute_device == "cuda" else "cpu"
        base = CalibrationConfig(measure=MeasureConfig(device=device))
    return dataclasses.replace(base, measure_missing=False, progress=False)


def recall_inputs(
    agent: PlacementAgent, topology: Topology, specs: OptionSpecs, module: nn.Module
) -> list[str]:
    """Where the planner learns (its agent calibrates), have ``specs`` take what running
    jobs of ``module``'s tables fed them, as the store keeps it (``JobObserver.replan``
    keeps it), over the declared pooling factors and the sample batches' reuse: a
    restarted job plans its tables as its last run fed them. Returns those tables."""
    wrapper = calibrating(agent)
    if wrapper is None or wrapper.calibration is None:
        return []
    store = calibration_config(agent, topology).store_path()
    pooling, reuse = recalled_inputs(store, module)
    specs.learn(pooling, reuse)
    return sorted(pooling)
