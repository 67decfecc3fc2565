"""What planning's adaptation to this machine bought, in words: predicted margins
(:func:`plan_margins`), calibration's line and the adaptation's lines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure.spent import spent_lines
from torchrec_dreamshard.verification.verification import heuristic_plans
from torchrec_dreamshard.verification.verify_result import (
    TORCHREC_WORDS,
    VerifyResult,
    percent,
    plan_words,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy import PlacementAgent


def plan_margins(
    agent: PlacementAgent,
    task: Task,
    placement: Sequence[int],
    baselines: dict[str, list[int]],
    label: str | None = None,
) -> dict[str, Any]:
    """The kept ``placement``'s predicted step over TorchRec's plan (the first of
    ``baselines``) and the best heuristic's, and one line saying so."""
    kept = agent.predict(task, placement).step_ms
    torchrec = next(iter(baselines.values()), None)
    vs_torchrec = kept / agent.predict(task, torchrec).step_ms if torchrec else None
    heuristics = [agent.predict(task, list(p)).step_ms for p in heuristic_plans(task).values()]
    vs_best = kept / min(heuristics) if heuristics else None
    same = torchrec is not None and list(placement) == list(torchrec)
    line = "kept " + plan_words("chosen", label) + (", the same as TorchRec's" if same else "")
    parts = []
    if vs_torchrec is not None and not same:
        parts.append(f"{percent(vs_torchrec)} TorchRec's")
    elif torchrec is None:
        line += f" ({TORCHREC_WORDS} was not planned here)"
    if vs_best is not None:
        parts.append(f"{percent(vs_best)} the best heuristic's")
    if parts:
        line += ", predicted " + " and ".join(parts) + " (not measured)"
    return {
        "kept": "chosen",
        "vs_torchrec": vs_torchrec,
        "vs_best_heuristic": vs_best,
        "measured": False,
        "line": line,
    }


def calibration_summary(calibration: dict[str, Any]) -> str:
    """One line of what calibration took and changed, from its ``to_dict`` or ``summary``."""
    before = calibration.get("kernel_mape_before", calibration.get("before", {}))
    after = calibration.get("kernel_mape_after", calibration.get("after", {}))
    before = before.get("cost/mape") if isinstance(before, dict) else before
    after = after.get("cost/mape") if isinstance(after, dict) else after
    error = (
        f"kernel time error {before:.0f}% before, {after:.0f}% after"
        if before is not None and after is not None
        else "no kernel to fit (none stored, none measured)"
    )
    measured = calibration.get("kernels_measured", calibration.get("measured", 0))
    reused = calibration.get("kernels_reused", calibration.get("reused", 0))
    seconds = calibration.get("seconds")
    took = f" in {seconds:.1f} s" if isinstance(seconds, int | float) else ""
    line = f"calibrated{took}: {measured} kernels measured, {reused} reused; {error}"
    note = calibration.get("note") or calibration.get("calibration_note")
    return f"{line}; {note}" if note else line


def adaptation_lines(adaptation: dict[str, Any]) -> list[str]:
    """How planning adapted to this machine: what it measured, what each took and bought."""
    lines = [adaptation.get("why", "")]
    if adaptation.get("profile_given"):
        lines.append("planned from a given machine profile: nothing measured here")
    if adaptation.get("calibrated"):
        lines.append(calibration_summary(adaptation))
    else:
        lines.append("planned with the checkpoint as it is (no calibration)")
    margins = adaptation.get("margins") or {}
    if margins.get("line"):
        lines.append(margins["line"])
    recalled = adaptation.get("inputs_from_job")
    if recalled:
        lines.append(
            f"{len(recalled)} tables planned as a running job of them fed them (pooling "
            "factors and reuse observed), not as declared"
        )
    notes = adaptation.get("measuring_notes") or []
    failures = adaptation.get("measure_failures") or []
    lines += [f"measuring: {n}" for n in notes if not adaptation.get("profile_given")]
    lines += [f"measuring failed, planned without it: {failure_words(f)}" for f in failures]
    return lines + spent_lines(adaptation.get("spent_s", {}))


def failure_words(failure: Any) -> str:
    """One failed measurement (a ``MeasureFailure``'s dict, or words) in words."""
    if isinstance(failure, dict):
        return f"{failure.get('what')}: {failure.get('error')}: {failure.get('message')}"
    return str(failure)


def verification_record(ver: VerifyResult | None) -> dict[str, Any]:
    """A verification as the adaptation record's ``verify_*`` keys."""
    if ver is None:
        return {"verified": False}
    return {
        "verified": True,
        "verify_plans": len(ver.plans),
        "verify_rounds": len(ver.winner.rounds_ms),
        "verify_seconds": ver.seconds,
        "verify_cached": ver.cached,
        "verify_chosen": ver.winner.name,
        "verify_noise": [n.to_dict() for n in ver.passes],
        "verify_fallback": ver.fallback,
    }
