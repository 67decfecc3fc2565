"""The planner's own options: one frozen value, validated at construction."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrec_dreamshard.calibration.fine_tuning import CalibrationConfig
from torchrec_dreamshard.cost.collective_models import CollectiveModels
from torchrec_dreamshard.cost.dense_kernel_model import DenseKernelModel
from torchrec_dreamshard.cost.storage_correction import StorageCorrection
from torchrec_dreamshard.policy.agent import PlacementMode, check_mode
from torchrec_dreamshard.policy.protocol import PlacementAgent
from torchrec_dreamshard.profile.machine_profile import MachineProfile

Calibrate = bool | float | CalibrationConfig | None
"""``calibrate``: ``None`` automatic, ``False`` never, ``True`` 60 s, seconds, or settings."""


@dataclass(frozen=True, kw_only=True)
class DreamShardOptions:
    """``DreamShardPlanner``'s keyword-only arguments, beyond TorchRec's.

    Attributes:
        checkpoint: a ``dreamshard train`` checkpoint (default: the bundled one).
        agent: an already loaded agent (overrides ``checkpoint``).
        mode: ``"safe"`` (policy roll-outs, heuristics and TorchRec's plan compete),
            ``"greedy"`` (one roll-out) or ``"search"`` (roll-outs only).
        num_samples: sampled policy roll-outs.
        seed: sampling seed.
        sample_batches: ``KeyedJaggedTensor`` batches; each table's reuse is measured.
        calibrate: ``None`` calibrates where the checkpoint misprices this machine;
            ``False`` never; ``True`` (60 s), seconds or a ``CalibrationConfig`` always.
        verify: candidate plans measured after TorchRec's loop beside the heuristics' and
            TorchRec's (0: none; ``None``: two where ``calibrate=None`` calibrated).
        collectives: the collective models the type choice prices with.
        dense_kernel: the dense kernel's model the type choice prices with.
        reuse_hists: reuse histograms (17 fractions) by table, where batches give none.
        bag_length_cvs: bag-length cvs (std / mean of ids per sample) by table.
        profile: a ``MachineProfile`` or its file: nothing is measured.
        measure: ``False``: nothing is measured at all.
        cache_dir: where measurements are cached (default: ``$XDG_CACHE_HOME``'s).
        storage_correction: factors over TorchRec's storage estimate, from a running job.
        verify_rounds: the verification's interleaved rounds.

    Raises:
        ValueError: an option is out of its range, naming it and what it takes.
        TypeError: an option is of the wrong type.
    """

    checkpoint: str | Path | None = None
    agent: PlacementAgent | None = None
    mode: PlacementMode = "safe"
    num_samples: int = 4
    seed: int = 0
    sample_batches: Iterable[Any] | None = None
    calibrate: Calibrate = None
    verify: int | None = None
    verify_rounds: int = 3
    collectives: CollectiveModels | None = None
    dense_kernel: DenseKernelModel | None = None
    reuse_hists: Mapping[str, Sequence[float]] | None = None
    bag_length_cvs: Mapping[str, float] | None = None
    profile: str | Path | MachineProfile | None = None
    measure: bool = True
    cache_dir: str | Path | None = None
    storage_correction: StorageCorrection | None = None

    def __post_init__(self) -> None:
        check_mode(self.mode)
        _whole("num_samples", self.num_samples, 0)
        _whole("seed", self.seed, None)
        _whole("verify_rounds", self.verify_rounds, 1)
        if self.verify is not None and (not _is_int(self.verify) or self.verify < 0):
            raise ValueError(
                "verify must be None (automatic) or an integer >= 0 candidate plans, "
                f"got {self.verify!r}"
            )
        if not isinstance(self.measure, bool):
            raise ValueError(f"measure must be True or False, got {self.measure!r}")
        calibrate = self.calibrate
        if not (calibrate is None or isinstance(calibrate, bool | int | float | CalibrationConfig)):
            raise ValueError(
                "calibrate must be None (automatic), False, True, a budget in seconds or a "
                f"CalibrationConfig, got {calibrate!r}"
            )
        if _is_number(calibrate) and calibrate <= 0:
            raise ValueError(f"calibrate must be a positive budget in seconds, got {calibrate}")
        if self.profile is not None and not isinstance(self.profile, str | Path | MachineProfile):
            raise ValueError(
                "profile must be a MachineProfile or the path of a profile file, "
                f"got {self.profile!r}"
            )

    def context(self) -> list[Any]:
        """The options a plan depends on beside the agent, in the planner's context hash."""
        return [self.mode, self.num_samples, self.seed, repr(self.calibrate), self.verify]


def option_names() -> tuple[str, ...]:
    """The options' names: ``DreamShardPlanner``'s keyword-only arguments."""
    return tuple(f.name for f in dataclasses.fields(DreamShardOptions))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(name: str, value: object, least: int | None) -> None:
    """Raise unless ``value`` is an integer of at least ``least``."""
    if not _is_int(value) or (least is not None and value < least):  # type: ignore[operator]
        floor = "" if least is None else f" >= {least}"
        raise ValueError(f"{name} must be an integer{floor}, got {value!r}")
