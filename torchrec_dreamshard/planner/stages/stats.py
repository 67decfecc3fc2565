"""``CostNetStats``: logs the cost network's predicted per-rank times of the chosen plan,
next to TorchRec's own ``EmbeddingStats`` table."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from torchrec.distributed.planner.types import ShardingOption, Stats
from torchrec.distributed.types import ShardingPlan

from torchrec_dreamshard.planner.plans.plan_prediction import PlanPrediction
from torchrec_dreamshard.planner.stages.perf_models import CostNetPerfModel
from torchrec_dreamshard.policy.safety_net import SafetyReport

logger: logging.Logger = logging.getLogger(__name__)

WIDTH = 80


def adaptation_lines(adaptation: dict[str, Any]) -> list[str]:
    """How planning adapted to this machine, as stats rows."""
    from torchrec_dreamshard.calibration.calibrating_agent import adaptation_lines as lines

    why, *rest = lines(adaptation)
    out = [f"This machine: {why}", *(f"  {line}" for line in rest)]
    types = adaptation.get("types")
    if types:
        out += type_choice_lines(types)
    return out


def type_choice_lines(types: dict[str, Any]) -> list[str]:
    """The type choice's decisions (``TypePlan.to_dict()``) as stats rows."""
    moved = types.get("moved", {})
    out = [f"Sharding types: {len(moved)} tables off table-wise"]
    for d in types.get("decisions", []):
        verdict = "kept" if d["kept"] else ("contested" if d["gain_ms"] > 0 else "slower")
        out.append(
            f"  {d['kind']} ({d['tables']} tables): gain {d['gain_ms']:.3f} ms, margin "
            f"{d['margin_ms']:.3f} ms: {verdict}, tipped by {d['tipped_by']} "
            f"({d['tipped_ms']:+.3f} ms)"
        )
    summary = types.get("summary")
    if summary:
        out += ["  The plan at scale, as the type choice predicts it (its own placement):"]
        out += scale_lines(summary)
    return out


def scale_lines(summary: dict[str, Any]) -> list[str]:
    """The type choice's ``TypeSummary.to_dict()`` as stats rows."""
    step = summary["step_ms"]
    out = []
    for kind in sorted(summary["tables"]):
        share = summary["share_ms"].get(kind, 0.0)
        pct = 100.0 * share / step if step > 0 else 0.0
        out.append(
            f"    {kind}: {summary['tables'][kind]} tables, "
            f"{summary['bytes'][kind] / 1e9:.2f} GB, {share:.2f} ms of the step ({pct:.0f}%)"
        )
    out.append(
        f"    slowest rank {summary['slowest_rank']}: {step:.2f} ms; inter-host traffic "
        f"{summary['inter_host_bytes'] / 1e9:.2f} GB per step"
    )
    return out


@dataclass(frozen=True)
class PlanNotes:
    """What the planner hands :class:`CostNetStats` to log beside TorchRec's call.

    Attributes:
        prediction: the plan's prediction (``None``: predicted by the stats).
        proposals: the proposal log's lines (which proposer's proposal won).
        report: the safety net's report of the policy's placement.
        adaptation: how the plan adapted to this machine.
    """

    prediction: PlanPrediction | None = None
    proposals: list[str] | None = None
    report: SafetyReport | None = None
    adaptation: dict[str, Any] | None = None


class CostNetStats(Stats):
    """Logs (``logging.INFO``) the cost network's predicted per-rank times of the plan, the
    proposers' ratings, the safety net's report and how the plan adapted to the machine.

    Args:
        perf_model: predicts the plan where no ``prediction`` is handed in.
    """

    def __init__(self, perf_model: CostNetPerfModel) -> None:
        self._perf_model = perf_model
        self.last_table: list[str] = []  # the rows it logged last

    def log(
        self,
        sharding_plan: ShardingPlan,
        topology: Any,
        batch_size: int,
        storage_reservation: Any,
        num_proposals: int,
        num_plans: int,
        run_time: float,
        best_plan: list[ShardingOption],
        *args: Any,
        notes: PlanNotes | None = None,
        **kwargs: Any,
    ) -> None:
        """Log the plan's predicted per-rank times with the planner's ``notes``."""
        if not sharding_plan.plan or not best_plan:
            return
        notes = notes or PlanNotes()
        proposals, report, adaptation = notes.proposals, notes.report, notes.adaptation
        prediction = notes.prediction or self._perf_model.predict(best_plan)
        title = "--- DreamShard cost network: predicted per-rank embedding times ---"
        rows = [
            *prediction.format(),
            "Fwd/Bwd: fused table-wise kernel; Comm: all-to-all;",
            "Other: TorchRec's perf estimate of the shards it placed",
        ]
        if proposals:
            rows += ["Proposers (rated by the planner's performance model):"]
            rows += ["  " + line for line in proposals]
        if report is not None:
            rows += report.lines()
        if adaptation is not None:
            rows += adaptation_lines(adaptation)
        self.last_table = ["#" * WIDTH, f"#{title: ^{WIDTH - 2}}#"]
        self.last_table += [f"# {row: <{WIDTH - 3}}#" for row in rows]
        self.last_table.append("#" * WIDTH)
        for row in self.last_table:
            logger.info(row)
