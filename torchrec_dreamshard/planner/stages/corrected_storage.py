"""``CorrectedStorage``: TorchRec's storage estimates scaled by what a running job
measured, run after ``EmbeddingStorageEstimator`` so every capacity check sees them."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from torchrec.distributed.planner.types import (
    ParameterConstraints,
    ShardEstimator,
    ShardingOption,
    Storage,
    Topology,
)

from torchrec_dreamshard.cost.storage_correction import StorageCorrection


class CorrectedStorage(ShardEstimator):
    """Scales each shard's ``storage`` by ``correction``'s factor of its table and kernel.

    Args:
        correction: the factors, or a callable giving them (or ``None``) at estimation,
            once the machine profile is known.
        topology: unused (TorchRec's estimator signature).
        constraints: unused.
    """

    def __init__(
        self,
        correction: StorageCorrection | Callable[[], StorageCorrection | None],
        topology: Topology | None = None,
        constraints: dict[str, ParameterConstraints] | None = None,
    ) -> None:
        self.correction = correction

    def estimate(
        self, sharding_options: list[ShardingOption], sharder_data_map: Any = None
    ) -> None:
        """Scale the shards' storage in place (a new ``Storage``: copies share theirs)."""
        correction = self.correction() if callable(self.correction) else self.correction
        if correction is None:
            return
        for option in sharding_options:
            factor = correction.factor(option.name, option.compute_kernel)
            if factor == 1.0:
                continue
            for shard in option.shards:
                if shard.storage is not None:
                    shard.storage = scaled(shard.storage, factor)


def scaled(storage: Storage, factor: float) -> Storage:
    """``storage`` times ``factor`` on every tier (rounded up)."""
    return Storage(
        hbm=math.ceil(storage.hbm * factor),
        ddr=math.ceil(storage.ddr * factor),
        ssd=math.ceil(storage.ssd * factor),
    )
