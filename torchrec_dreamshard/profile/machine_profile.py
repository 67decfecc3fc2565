"""The machine profile (:class:`MachineProfile`) and its file: a ``torch.save`` of plain
values and tensors, loaded with ``weights_only=True``."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from torchrec_dreamshard.cost.collective_models import CollectiveModels
from torchrec_dreamshard.cost.dense_kernel_model import DenseKernelModel
from torchrec_dreamshard.cost.sharding_path_model import ShardingPathModel
from torchrec_dreamshard.cost.storage_correction import StorageCorrection
from torchrec_dreamshard.io import atomic_path
from torchrec_dreamshard.policy.checkpoint import plain
from torchrec_dreamshard.profile.stamp import MachineStamp

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchrec_dreamshard.policy import DreamShard

FORMAT = "torchrec-dreamshard-profile"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class ProfileCalibration:
    """The cost network calibrated on this machine's kernels.

    Attributes:
        prior: the fingerprint of the checkpoint's agent it was fine-tuned from.
        summary: what calibration measured and bought (kernels, errors, seconds).
        record: the calibration's whole record and printed ``lines``.
    """

    prior: str
    cost_net: dict[str, torch.Tensor]
    meta: dict[str, Any]
    summary: dict[str, Any]
    record: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MachineProfile:
    """What the planner knows of the machine, frozen for TorchRec's loop.

    Attributes:
        reference_ms: the reference kernel's ``(fwd, bwd)`` ms (``None``: not measured).
        reference_predicted_ms: the checkpoint's prediction of it (``None``: unknown).
        collectives: the collective models the type choice prices with (``None``: every
            table stays table-wise).
        dense_kernel: the dense kernel's model (``None``: analytic).
        sharding_path: a sharding path's cost beyond its kernels and collectives (``None``:
            not charged).
        calibration: the calibrated cost network (``None``: the checkpoint's as it is).
        notes: what was not measured, and why.
        failures: measurements that failed, each a ``MeasureFailure``'s dict.
        spent_s: seconds each part took to measure or load.
        storage_correction: factors over TorchRec's storage estimate measured in a job on
            this hardware.
    """

    stamp: MachineStamp
    reference_ms: tuple[float, float] | None = None
    reference_predicted_ms: tuple[float, float] | None = None
    collectives: CollectiveModels | None = None
    collectives_source: str = "none"
    dense_kernel: DenseKernelModel | None = None
    sharding_path: ShardingPathModel | None = None
    calibration: ProfileCalibration | None = None
    notes: tuple[str, ...] = ()
    failures: tuple[dict[str, Any], ...] = ()
    spent_s: dict[str, float] = field(default_factory=dict)
    storage_correction: StorageCorrection | None = None

    @property
    def calibrated(self) -> bool:
        return self.calibration is not None

    def agent(self, prior: DreamShard) -> DreamShard:
        """``prior`` with this profile's calibrated cost network (``prior`` itself without one,
        or where it was calibrated from another checkpoint)."""
        from torchrec_dreamshard.policy import DreamShard

        cal = self.calibration
        if cal is None or cal.prior != prior.fingerprint():
            return prior
        net = copy.deepcopy(prior.cost_net)
        net.load_state_dict(cal.cost_net)
        return DreamShard(
            net, prior.policy, dict(cal.meta), penalty=prior.penalty, sources=prior.sources
        )

    def with_notes(self, *notes: str) -> MachineProfile:
        return dataclasses.replace(self, notes=self.notes + tuple(notes))

    def summary(self) -> dict[str, Any]:
        """The profile as JSON-able values, without the network's weights."""
        cal = self.calibration
        return {
            "stamp": self.stamp.to_dict(),
            "reference_ms": _pair(self.reference_ms),
            "reference_predicted_ms": _pair(self.reference_predicted_ms),
            "collectives_source": self.collectives_source,
            "dense_kernel": self.dense_kernel is not None,
            "sharding_path_ms": None
            if self.sharding_path is None
            else self.sharding_path.median_ms,
            "calibrated": cal is not None,
            "calibration": dict(cal.summary) if cal is not None else None,
            "notes": list(self.notes),
            "failures": [dict(f) for f in self.failures],
            "spent_s": dict(self.spent_s),
            "storage_correction": self.storage_correction is not None,
        }

    # -- the file -------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Write the profile to ``path`` atomically (plain values and tensors only)."""
        cal = self.calibration
        calibration = None
        if cal is not None:
            calibration = {
                "prior": cal.prior,
                "meta": cal.meta,
                "summary": cal.summary,
                "record": cal.record,
            }
        values = {
            "stamp": self.stamp.to_dict(),
            "reference_ms": _pair(self.reference_ms),
            "reference_predicted_ms": _pair(self.reference_predicted_ms),
            "collectives": _to_dict(self.collectives),
            "collectives_source": self.collectives_source,
            "dense_kernel": _to_dict(self.dense_kernel),
            "sharding_path": _to_dict(self.sharding_path),
            "calibration": calibration,
            "notes": list(self.notes),
            "failures": [dict(f) for f in self.failures],
            "spent_s": dict(self.spent_s),
            "storage_correction": _to_dict(self.storage_correction),
        }
        payload = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            **plain(values),
            "cost_net": None if cal is None else dict(cal.cost_net),
        }
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path, "machine profile") as tmp:
            torch.save(payload, tmp)

    @classmethod
    def load(cls, path: str | Path) -> MachineProfile:
        """The profile in ``path`` (a ``ValueError`` naming the file for any problem)."""
        where = f"machine profile {str(path)!r}"
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"{where} does not exist (dreamshard profile --out PATH writes one)")
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # truncated, corrupt, or a pickle with code
            raise ValueError(
                f"{where} could not be read safely: {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise ValueError(f"{where} is not a torchrec-dreamshard machine profile")
        if payload.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{where} has format_version {payload.get('format_version')!r}; this package "
                f"reads {FORMAT_VERSION}: measure it again with dreamshard profile"
            )
        try:
            return cls._from_payload(payload)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where} is malformed: {exc}") from None

    @classmethod
    def _from_payload(cls, payload: dict[str, Any]) -> MachineProfile:
        cal = payload["calibration"]
        net = payload["cost_net"]
        if (cal is None) != (net is None):
            raise ValueError("the calibration and the cost network's weights come together")
        calibration = None
        if cal is not None:
            if not all(isinstance(v, torch.Tensor) for v in net.values()):
                raise ValueError("the cost network's weights must be tensors")
            calibration = ProfileCalibration(
                str(cal["prior"]),
                dict(net),
                dict(cal["meta"]),
                dict(cal["summary"]),
                dict(cal.get("record") or {}),
            )
        return cls(
            stamp=MachineStamp.from_dict(payload["stamp"]),
            reference_ms=_tuple_or_none(payload["reference_ms"]),
            reference_predicted_ms=_tuple_or_none(payload["reference_predicted_ms"]),
            collectives=_from_dict(CollectiveModels, payload["collectives"]),
            collectives_source=str(payload["collectives_source"]),
            dense_kernel=_from_dict(DenseKernelModel, payload["dense_kernel"]),
            sharding_path=_from_dict(ShardingPathModel, payload.get("sharding_path")),
            calibration=calibration,
            notes=tuple(str(n) for n in payload["notes"]),
            failures=tuple(dict(f) for f in payload["failures"]),
            spent_s={str(k): float(v) for k, v in payload["spent_s"].items()},
            storage_correction=_from_dict(StorageCorrection, payload.get("storage_correction")),
        )


def _to_dict(value: Any) -> dict[str, Any] | None:
    return None if value is None else value.to_dict()


def _from_dict(cls: Any, data: Any) -> Any:
    return None if data is None else cls.from_dict(data)


def _pair(value: tuple[float, float] | None) -> list[float] | None:
    return None if value is None else [float(value[0]), float(value[1])]


def _tuple_or_none(value: Any) -> tuple[float, float] | None:
    if value is None:
        return None
    fwd, bwd = value
    return float(fwd), float(bwd)
