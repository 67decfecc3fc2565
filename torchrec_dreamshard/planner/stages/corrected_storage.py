"""``CorrectedStorage``: TorchRec's storage estimate of every sharding option, scaled by
what a running job measured (a :class:`~torchrec_dreamshard.cost.storage_correction.
StorageCorrection`). An estimator run after TorchRec's ``EmbeddingStorageEstimator``, so
every storage the planner checks against a device's capacity (the enumerator's, the
partitioners', the policy's weight-to-storage ratio) is the corrected one."""

from __future__ import annotations

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
    """Scales each shard's ``storage`` (every tier) by ``correction``'s factor of its
    table and compute kernel.

    Args:
        correction: the factors, or what gives them when the options are estimated
            (``None`` from it: nothing is scaled), so a planner can take its machine
            profile's correction, known only once the profile step has run.
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
        """Scale the shards' storage of ``sharding_options`` in place (a new ``Storage``
        each: copied options share theirs)."""
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
    import math

    return Storage(
        hbm=math.ceil(storage.hbm * factor),
        ddr=math.ceil(storage.ddr * factor),
        ssd=math.ceil(storage.ssd * factor),
    )
