"""The observed job's memory as plain JSON: per rank and table shard, the plan's storage
estimate beside what was measured and the part that was off; per rank its peak and cap."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from torchrec_dreamshard.cost.storage_correction import StorageCorrection
from torchrec_dreamshard.feedback.rank_memory import BUFFERS

PARTS = ("weights", "optimizer", "buffers")
TOLERANCE = 0.10  # a table or rank whose measured bytes are this far off is named
MARGIN = 0.10  # a rank whose peak is within this share of its cap is warned of
RESERVATION = 0.15  # TorchRec's default heuristical storage reservation


def reserved_share(record: Any) -> float:
    """The planner's ``heuristical_storage_reservation_percentage`` (TorchRec's 15% default)."""
    arguments = getattr(getattr(record, "replanner", None), "arguments", {})
    share = arguments.get("heuristical_storage_reservation_percentage", RESERVATION)
    return float(share if share is not None else RESERVATION)


def state_estimates(option: Any, world_size: int, tier: str) -> list[int]:
    """TorchRec's storage estimate of each shard on ``tier`` with no batch (weights and
    optimizer state only)."""
    from torchrec.distributed.planner.shard_estimators import calculate_shard_storages
    from torchrec.distributed.planner.types import SharderData
    from torchrec.distributed.types import StorageUsageType

    inputs = len(option.input_lengths)
    storages = calculate_shard_storages(
        SharderData({}, {}, StorageUsageType.BASE),
        option.sharding_type,
        option.tensor,
        "cuda" if tier == "hbm" else "cpu",
        option.compute_kernel,
        [shard.size for shard in option.shards],
        [0] * inputs,
        world_size,
        world_size,
        list(option.input_lengths),
        [1.0] * inputs,
        option.cache_load_factor or 0.2,
        option.is_pooled,
        8,
        4,
    )
    return [int(getattr(s, tier)) for s in storages]


def option_estimates(
    options: Sequence[Any],
    tier: str,
    world_size: int,
    correction: StorageCorrection | None = None,
) -> list[dict[str, Any]]:
    """Every shard of ``options`` as ``{"rank", "table", "kernel", "predicted": {total,
    weights, optimizer, buffers}, "uncorrected"}`` on ``tier`` (``correction``: the plan's)."""
    out = []
    for option in options:
        factor = correction.factor(option.name, option.compute_kernel) if correction else 1.0
        element = option.tensor.element_size()
        states = state_estimates(option, world_size, tier)
        for shard, state in zip(option.shards, states, strict=True):
            total = int(getattr(shard.storage, tier)) if shard.storage is not None else 0
            uncorrected = total / factor
            weights = math.prod(shard.size) * element
            optimizer = max(0, state - weights)
            buffers = max(0.0, uncorrected - state)
            out.append(
                {
                    "rank": shard.rank,
                    "table": option.fqn,
                    "kernel": option.compute_kernel,
                    "uncorrected": uncorrected,
                    "predicted": {
                        "total": total,
                        "weights": weights * factor,
                        "optimizer": optimizer * factor,
                        "buffers": buffers * factor,
                    },
                }
            )
    return out


def _measured_parts(parts: Mapping[str, int]) -> dict[str, int]:
    buffers = sum(parts.get(k, 0) for k in BUFFERS)
    out = {
        "weights": parts.get("weights", 0),
        "optimizer": parts.get("optimizer", 0),
        "buffers": buffers,
    }
    out["total"] = sum(out.values())
    out.update({k: parts.get(k, 0) for k in BUFFERS})
    return out


def _off(predicted: Mapping[str, float], measured: Mapping[str, float]) -> str | None:
    """The part with the largest difference where the total is :data:`TOLERANCE` off."""
    total = predicted["total"]
    if abs(measured["total"] - total) <= TOLERANCE * max(total, 1):
        return None
    return max(PARTS, key=lambda p: abs(measured[p] - predicted[p]))


def table_rows(estimates: list[dict[str, Any]], measured: Mapping[str, Any]) -> list[dict]:
    """One rank's tables, predicted beside ``measured`` (the rank's snapshot)."""
    tables = measured.get("tables", {})
    rows = []
    for e in estimates:
        got = _measured_parts(tables.get(e["table"], {}))
        rows.append(
            {
                "table": e["table"],
                "kernel": e["kernel"],
                "predicted": e["predicted"],
                "uncorrected": e["uncorrected"],
                "measured": got,
                "difference": got["total"] - e["predicted"]["total"],
                "off": _off(e["predicted"], got),
            }
        )
    return rows


def rank_row(
    rank: int,
    rows: list[dict],
    measured: Mapping[str, Any],
    cap: int,
    reserved_share: float,
    margin: float,
) -> dict[str, Any]:
    """One rank of the memory report."""
    predicted = sum(r["predicted"]["total"] for r in rows)
    got = sum(r["measured"]["total"] for r in rows)
    peak = int(measured.get("peak", 0))
    parts = {p: sum(r["measured"][p] - r["predicted"][p] for r in rows) for p in PARTS}
    reserved = int(cap * reserved_share) if cap else 0
    beyond = max(0, peak - got)
    off = []  # the parts of a rank whose tables are more than TOLERANCE off in all
    if abs(got - predicted) > TOLERANCE * max(predicted, 1):
        off = [p for p in PARTS if abs(parts[p]) > TOLERANCE * max(predicted, 1)]
        off.sort(key=lambda p: -abs(parts[p]))
    if cap and beyond > reserved:
        off.append("reservation")
    return {
        "rank": rank,
        "predicted": predicted,
        "measured": got,
        "difference": got - predicted,
        "error": got / predicted - 1 if predicted > 0 else None,
        "part_differences": parts,
        "off": off,
        "held": int(measured.get("held", 0)),
        "transient": int(measured.get("transient", 0)),
        "peak": peak,
        "cap": cap,
        "reserved": reserved,
        "beyond_tables": beyond,
        "near_cap": bool(cap) and peak >= (1 - margin) * cap,
        "tables": rows,
    }


def build_memory_report(
    estimates: list[dict[str, Any]],
    measured: Sequence[Mapping[str, Any]],
    caps: Sequence[int],
    reserved_share: float = RESERVATION,
    margin: float = MARGIN,
) -> dict[str, Any]:
    """The memory report from :func:`option_estimates`, every rank's snapshot and each cap."""
    ranks = []
    for r, m in enumerate(measured):
        mine = [e for e in estimates if e["rank"] == r]
        cap = int(caps[r]) if r < len(caps) else 0
        ranks.append(rank_row(r, table_rows(mine, m), m, cap, reserved_share, margin))
    errors = [abs(r["error"]) for r in ranks if r["error"] is not None]
    return {
        "ranks": ranks,
        "near_cap": [r["rank"] for r in ranks if r["near_cap"]],
        "worst_error": max(errors) if errors else None,
        "margin": margin,
        "steps": min((int(m.get("steps", 0)) for m in measured), default=0),
    }


def learn_correction(
    report: Mapping[str, Any], skip: Sequence[str] = (), source: str = "observed job"
) -> StorageCorrection:
    """Measured over TorchRec's uncorrected estimate, per table and per compute kernel
    (the median over its tables); ``skip``'d tables keep only their kernel's factor."""
    measured: dict[str, float] = {}
    estimated: dict[str, float] = {}
    kernels: dict[str, str] = {}
    for rank in report["ranks"]:
        for row in rank["tables"]:
            fqn = row["table"]
            measured[fqn] = measured.get(fqn, 0.0) + row["measured"]["total"]
            estimated[fqn] = estimated.get(fqn, 0.0) + row["uncorrected"]
            kernels[fqn] = row["kernel"]
    factors = {
        fqn: measured[fqn] / estimated[fqn]
        for fqn in measured
        if estimated[fqn] > 0 and measured[fqn] > 0
    }
    by_kernel: dict[str, list[float]] = {}
    for fqn, f in factors.items():
        by_kernel.setdefault(kernels[fqn], []).append(f)
    tables = {fqn.rsplit(".", 1)[-1]: f for fqn, f in factors.items() if fqn not in set(skip)}
    kernel_factors = {k: statistics.median(v) for k, v in by_kernel.items()}
    return StorageCorrection(tables, kernel_factors, source)


def corrected_report(report: dict[str, Any], correction: StorageCorrection) -> dict[str, Any]:
    """``report`` with every prediction made anew under ``correction``."""
    import copy

    out = copy.deepcopy(report)
    for rank in out["ranks"]:
        for row in rank["tables"]:
            name = row["table"].rsplit(".", 1)[-1]
            f = correction.factor(name, row["kernel"])
            old = row["predicted"]["total"] or 1
            scale = row["uncorrected"] * f / old
            row["predicted"] = {k: v * scale for k, v in row["predicted"].items()}
            row["difference"] = row["measured"]["total"] - row["predicted"]["total"]
            row["off"] = _off(row["predicted"], row["measured"])
        measured = {"peak": rank["peak"], "held": rank["held"], "transient": rank["transient"]}
        share = rank["reserved"] / rank["cap"] if rank["cap"] else RESERVATION
        new = rank_row(rank["rank"], rank["tables"], measured, rank["cap"], share, out["margin"])
        rank.update(new)
    errors = [abs(r["error"]) for r in out["ranks"] if r["error"] is not None]
    out["worst_error"] = max(errors) if errors else None
    return out


def memory_correction(
    record: Any, memory: dict[str, Any] | None, arguments: dict[str, Any], inputs: Any
) -> tuple[Any, bool]:
    """Step 4 of the re-plan: ``(correction, memory_bound)``, the storage correction learnt
    (merged over the plan's) and whether the observed plan does not fit under it;
    ``(None, False)`` without a memory report."""
    if memory is None or not memory.get("ranks"):
        return None, False
    skip = [t.fqn for t in inputs.mispriced()] if arguments and inputs is not None else []
    learned = learn_correction(memory, skip)
    planned = record.replanner.arguments.get("storage_correction")
    correction = planned.merged(learned) if planned is not None else learned
    corrected = corrected_report(memory, correction)
    over = [
        r["rank"]
        for r in corrected["ranks"]
        if r["cap"] and r["predicted"] > r["cap"] - r["reserved"]
    ]
    return correction, bool(memory["near_cap"] or over)


def _mb(n: float) -> str:
    return f"{n / 2**20:.2f}"


def memory_lines(report: Mapping[str, Any]) -> list[str]:
    """The memory report as a table, like TorchRec's planner stats."""
    lines = [
        f"DreamShard: memory predicted (the plan's storage estimate) against measured per "
        f"rank, {report['steps']} sampled steps (MiB)",
        "rank  predicted  measured   error   peak     cap  off",
    ]
    for r in report["ranks"]:
        error = "-" if r["error"] is None else f"{r['error']:+.0%}"
        cap = _mb(r["cap"]) if r["cap"] else "-"
        lines.append(
            f"{r['rank']:>4}  {_mb(r['predicted']):>9}  {_mb(r['measured']):>8}  {error:>6}  "
            f"{_mb(r['peak']):>5}  {cap:>6}  {', '.join(r['off']) or '-'}"
        )
    for r in report["ranks"]:
        for t in r["tables"]:
            if t["off"]:
                p, m = t["predicted"], t["measured"]
                lines.append(
                    f"  rank {r['rank']} {t['table']}: predicted {_mb(p['total'])}, measured "
                    f"{_mb(m['total'])} MiB; {t['off']} off ({_mb(p[t['off']])} -> "
                    f"{_mb(m[t['off']])} MiB)"
                )
    for r in report["ranks"]:
        if r["near_cap"]:
            lines.append(near_cap_warning(r, report["margin"]))
    return lines


def near_cap_warning(rank: Mapping[str, Any], margin: float) -> str:
    """The warning of a rank whose peak is within ``margin`` of its cap (or beyond it)."""
    where = "beyond" if rank["peak"] > rank["cap"] else f"within {margin:.0%} of"
    return (
        f"WARNING: rank {rank['rank']} peaks at {_mb(rank['peak'])} MiB, {where} its cap of "
        f"{_mb(rank['cap'])} MiB: it may run out of memory (re-plan: observer.replan() "
        "corrects the storage estimate with what was measured)"
    )
