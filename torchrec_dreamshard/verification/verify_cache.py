"""This machine's cache of a verification's rounds, keyed by task, plans and settings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchrec_dreamshard.cache.machine_cache import (
    CacheFile,
    machine_cache_file,
    read_cached_data,
    write_cached_data,
)
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure.config import MeasureConfig, stable_key
from torchrec_dreamshard.verification.noise import Noise
from torchrec_dreamshard.verification.verify_result import Dropped, VerifiedPlan

WHAT = "verification cache"


def verification_cache_file(
    task: Task, plans: Sequence[VerifiedPlan], config: MeasureConfig, rounds: int
) -> CacheFile:
    """This machine's cache file of the verification of ``plans`` of ``task``."""
    verified = stable_key(
        [task.to_dict(), [p.placement for p in plans], config.to_dict(), rounds], length=16
    )
    device = config.device
    return machine_cache_file("verification", device, device, verified=verified)


def read_rounds(file: CacheFile, plans: Sequence[VerifiedPlan]) -> list[Noise] | None:
    """Fill ``plans``' rounds from ``file`` and return its passes' noise (``None``: missing, of
    another key, or of other plans)."""
    data = read_cached_data(file, WHAT)
    stored = data.get("plans") if isinstance(data, dict) else None
    if not _holds(stored, plans):
        return None
    try:
        passes = [Noise.from_dict(n) for n in data.get("passes", [])]
    except (KeyError, TypeError):
        return None
    try:
        dropped = [
            None if s.get("dropped") is None else Dropped.from_dict(s["dropped"]) for s in stored
        ]
    except (KeyError, TypeError, ValueError):
        return None
    for p, s, d in zip(plans, stored, dropped, strict=True):
        p.rounds_ms = [float(ms) for ms in s["rounds_ms"]]
        p.earlier_ms = [float(ms) for ms in s.get("earlier_ms", [])]
        p.dropped = d
    return passes


def _holds(stored: Any, plans: Sequence[VerifiedPlan]) -> bool:
    """Whether ``stored`` (a cache file's plans) holds the rounds of exactly ``plans``."""
    if not isinstance(stored, list) or len(stored) != len(plans):
        return False
    for p, s in zip(plans, stored, strict=True):
        if not isinstance(s, dict) or s.get("placement") != p.placement:
            return False
        if not isinstance(s.get("rounds_ms"), list):
            return False
    # every plan measured in every round has as many (a slow task's left out none; a
    # plan that dropped out has fewer)
    ranked = [s for s in stored if s["rounds_ms"] and s.get("dropped") is None]
    return len({len(s["rounds_ms"]) for s in ranked}) <= 1


def write_rounds(file: CacheFile, plans: Sequence[VerifiedPlan], passes: Sequence[Noise]) -> None:
    """Write ``plans``' rounds and the ``passes``' noise to ``file``."""
    data = {
        "plans": [
            {
                "placement": p.placement,
                "rounds_ms": p.rounds_ms,
                "earlier_ms": p.earlier_ms,
                "dropped": None if p.dropped is None else p.dropped.to_dict(),
            }
            for p in plans
        ],
        "passes": [{k: v for k, v in n.to_dict().items() if k != "noisy"} for n in passes],
    }
    write_cached_data(file, data, WHAT)
