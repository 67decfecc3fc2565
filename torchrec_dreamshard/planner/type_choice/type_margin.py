"""The margin a sharding-type decision must clear, and its record.

The gain ``G = step(all-TW) - step(typed)`` splits at each plan's slowest rank into its
sources; each source's error is its relative error times its change: fused kernels
``e_k |dF|`` (``e_k``: the ensemble spread or the calibrated MAPE, else
:data:`KERNEL_ERROR`), the dense kernel ``mape |dD|`` (else :data:`UNFITTED_ERROR`), each
fitted collective's RMSE, the sharding path's standard error times the change in paths.
With ``U = sqrt(sum of squares)``, a candidate is kept only if
``G > max(Z_SCORE * U, TYPE_MARGIN * step(all-TW))``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from torchrec_dreamshard.cost.collective_models import CollectiveModels
from torchrec_dreamshard.cost.dense_kernel_model import DenseKernelModel
from torchrec_dreamshard.cost.sharding import PATH_KIND
from torchrec_dreamshard.policy.protocol import PlacementAgent

TYPE_MARGIN = 0.02  # a typed plan must be rated at least this much below all-table-wise
Z_SCORE = 2.0  # ... and by this many of its uncertainties (about 98% one-sided, if normal)
KERNEL_ERROR = 0.25  # relative error of fused kernels from a network not calibrated here
# (calibration.auto.AUTO_TOLERANCE: the automatic check trusts it to within this much)
UNFITTED_ERROR = 0.5  # relative error of the analytic dense passes (no model fitted here)


@dataclass
class TypeDecision:
    """One typed candidate against all-table-wise.

    Attributes:
        kind: the sharding type (joined by ``+`` for the best of each together).
        tables: tables it moves off table-wise.
        gain_ms: all-table-wise step minus its step (> 0: faster).
        uncertainty_ms: ``U``, the gain's predicted error.
        margin_ms: ``max(Z_SCORE * U, TYPE_MARGIN * step)``.
        kept: whether it cleared the margin.
        contributions: the gain by source (ms; they sum to it).
        errors: ``U`` by source (ms).
        fewest_of: the best-rated count where fewer tables were kept, else ``None``.
    """

    kind: str
    tables: int
    gain_ms: float
    uncertainty_ms: float
    margin_ms: float
    kept: bool
    contributions: dict[str, float] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    fewest_of: int | None = None

    @property
    def tipped_by(self) -> tuple[str, float]:
        """The source that tipped it (ms): the largest gain where kept, the largest cost where
        lost, the largest error where contested."""
        if self.kept or (self.gain_ms <= 0 and self.contributions):
            pick = max if self.kept else min
            name = pick(self.contributions, key=lambda k: (self.contributions[k], k))
            return name, self.contributions[name]
        if self.errors and max(self.errors.values()) > 0:
            name = max(self.errors, key=lambda k: (self.errors[k], k))
            return f"uncertainty of {name}", self.errors[name]
        return "the floor (TYPE_MARGIN)", self.margin_ms

    def to_dict(self) -> dict:
        name, ms = self.tipped_by
        return {
            "kind": self.kind,
            "tables": self.tables,
            "gain_ms": self.gain_ms,
            "uncertainty_ms": self.uncertainty_ms,
            "margin_ms": self.margin_ms,
            "kept": self.kept,
            "tipped_by": name,
            "tipped_ms": ms,
            "contributions_ms": dict(self.contributions),
            "errors_ms": dict(self.errors),
            "fewest_of": self.fewest_of,
        }

    def line(self) -> str:
        name, ms = self.tipped_by
        verdict = "kept" if self.kept else ("contested" if self.gain_ms > 0 else "slower")
        return (
            f"  {self.kind} ({self.tables} tables): predicted gain {self.gain_ms:.3f} ms, "
            f"margin {self.margin_ms:.3f} ms (uncertainty {self.uncertainty_ms:.3f} ms): "
            f"{verdict}; tipped by {name} ({ms:+.3f} ms)"
            + (
                f"; {self.tables} tables rather than the best-rated {self.fewest_of}, "
                "within its margin: the simpler plan"
                if self.fewest_of is not None
                else ""
            )
        )


@dataclass(frozen=True)
class ModelErrors:
    """The relative (kernels) and absolute (collectives, ms) errors the margin uses, and their
    sources."""

    kernel: float
    kernel_source: str
    dense: float
    dense_source: str
    collectives: dict[str, float]
    collectives_source: str
    path_error: float = 0.0
    path_ms: float = 0.0

    def errors(self, base: dict[str, float], typed: dict[str, float]) -> dict[str, float]:
        """``U`` by source between the two plans' slowest-rank breakdowns."""
        out = {
            "fused_kernels": self.kernel * abs(base["fused_kernels"] - typed["fused_kernels"]),
            "dense_kernel": self.dense * abs(base["dense_kernel"] - typed["dense_kernel"]),
        }
        if self.path_ms > 0:  # the path's error per path the plans differ by
            paths = abs(base.get(PATH_KIND, 0.0) - typed.get(PATH_KIND, 0.0)) / self.path_ms
            out[PATH_KIND] = self.path_error * round(paths)
        for kind in sorted(set(base) | set(typed) - {"fused_kernels", "dense_kernel"}):
            if kind in out:
                continue
            changed = abs(base.get(kind, 0.0) - typed.get(kind, 0.0)) > 1e-12
            out[kind] = self.collectives.get(kind, 0.0) if changed else 0.0
        return out

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def model_errors(
    agent: PlacementAgent,
    spread: float,
    collectives: CollectiveModels,
    dense_kernel: DenseKernelModel | None,
    path_ms: float = 0.0,
    path_error_ms: float = 0.0,
) -> ModelErrors:
    """The errors of the models the type choice prices with (``path_ms`` 0: no path charged)."""
    calibrated = (agent.meta or {}).get("calibrated") or {}
    mape = calibrated.get("kernel_mape") if isinstance(calibrated, dict) else None
    if mape is not None and math.isfinite(mape):
        kernel, how = max(spread, mape / 100), f"calibrated here: kernel MAPE {mape:.1f}%"
    else:
        kernel, how = max(spread, KERNEL_ERROR), "not calibrated here"
    how += f"; ensemble spread {spread:.3f}"
    if dense_kernel is not None and dense_kernel.mape is not None:
        dense, dense_how = dense_kernel.mape / 100, f"fitted: {dense_kernel.source}"
    else:
        dense, dense_how = UNFITTED_ERROR, "analytic dense passes (no fit)"
    fitted = {k: m.rmse_ms for k, m in collectives.models.items() if m.samples > 0}
    comm_how = (
        f"fitted RMSE: {collectives.source}" if fitted else f"not fitted: {collectives.source}"
    )
    return ModelErrors(kernel, how, dense, dense_how, fitted, comm_how, path_error_ms, path_ms)


@dataclass
class TypeSummary:
    """A typed plan explained, as the typed cost model predicts it.

    Attributes:
        tables: tables per sharding type.
        bytes: their weights' bytes per type (every replica counted once).
        share_ms: per type, the slowest rank's ms its tables cause.
        slowest_rank: the rank that sets the predicted step.
        step_ms: its predicted total.
        inter_host_bytes: bytes that cross hosts per step, both ways.
    """

    tables: dict[str, int]
    bytes: dict[str, float]
    share_ms: dict[str, float]
    slowest_rank: int
    step_ms: float
    inter_host_bytes: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def lines(self) -> list[str]:
        """One row per type, then the slowest rank and the inter-host traffic."""
        out = []
        for kind in sorted(self.tables):
            share = self.share_ms.get(kind, 0.0)
            pct = 100.0 * share / self.step_ms if self.step_ms > 0 else 0.0
            out.append(
                f"  {kind}: {self.tables[kind]} tables, {self.bytes[kind] / 1e9:.2f} GB, "
                f"{share:.2f} ms of the slowest rank's step ({pct:.0f}%)"
            )
        out.append(
            f"  slowest rank {self.slowest_rank}: {self.step_ms:.2f} ms predicted; "
            f"inter-host traffic {self.inter_host_bytes / 1e9:.2f} GB per step"
        )
        return out
