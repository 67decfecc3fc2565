"""This machine's cache of a verification's rounds: the same plans of the same task,
measured with the same settings, are read back instead of measured again."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torchrec_dreamshard.calibration.noise import Noise
from torchrec_dreamshard.calibration.verify_result import VerifiedPlan
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure.config import MeasureConfig


def verification_cache_path(
    task: Task, plans: Sequence[VerifiedPlan], config: MeasureConfig, rounds: int
) -> Path:
    """This machine's cache file of the verification of ``plans`` of ``task`` (the tables,
    devices, memory and batch, the plans' placements, the measurement's settings)."""
    from torchrec_dreamshard.measure.config import stable_key
    from torchrec_dreamshard.measure.hardware import device_name
    from torchrec_dreamshard.measure.machine_cache import machine_cache_path

    key = stable_key(
        [task.to_dict(), [p.placement for p in plans], config.to_dict(), rounds], length=16
    )
    device = config.device
    return machine_cache_path(f"verification_{device}_{key}", device_name(device))


def read_rounds(path: Path, plans: Sequence[VerifiedPlan]) -> list[Noise] | None:
    """Fill ``plans``' rounds from ``path`` and return its passes' noise; ``None`` (and
    nothing filled) when the file is missing or does not hold exactly these plans."""
    from torchrec_dreamshard.io import read_json

    if not path.exists():
        return None
    data = read_json(path, "verification cache")
    stored = data.get("plans") if isinstance(data, dict) else None
    if not isinstance(stored, list) or len(stored) != len(plans):
        return None
    for p, s in zip(plans, stored, strict=True):
        if not isinstance(s, dict) or s.get("placement") != p.placement:
            return None
        if not isinstance(s.get("rounds_ms"), list):
            return None
    if len({len(s["rounds_ms"]) for s in stored if s["rounds_ms"]}) > 1:
        return None  # every plan measured has as many rounds (a slow task's left out none)
    try:
        passes = [Noise.from_dict(n) for n in data.get("passes", [])]
    except (KeyError, TypeError):
        return None
    for p, s in zip(plans, stored, strict=True):
        p.rounds_ms = [float(ms) for ms in s["rounds_ms"]]
        p.earlier_ms = [float(ms) for ms in s.get("earlier_ms", [])]
    return passes


def write_rounds(path: Path, plans: Sequence[VerifiedPlan], passes: Sequence[Noise]) -> None:
    """Write ``plans``' rounds and the ``passes``' noise to ``path`` (read back by
    :func:`read_rounds`)."""
    from torchrec_dreamshard.io import atomic_write, dumps_strict

    data = {
        "plans": [
            {"placement": p.placement, "rounds_ms": p.rounds_ms, "earlier_ms": p.earlier_ms}
            for p in plans
        ],
        "passes": [{k: v for k, v in n.to_dict().items() if k != "noisy"} for n in passes],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, dumps_strict(data), "verification cache")
