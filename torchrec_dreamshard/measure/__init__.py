"""Measuring placements on real FBGEMM kernels.

* :func:`measure_placement` runs one fused table-batched embedding kernel per device
  (forward, and backward with the fused optimizer) and the all-to-all of pooled embeddings,
  with the ``"local"`` or ``"distributed"`` backend (the local one charges the all-to-all
  from a model the caller hands in, :class:`AllToAllCost`: the machine's fitted one is
  :func:`torchrec_dreamshard.cost.collective_models.load_all_to_all_model`);
* :func:`time_fused_kernel` times one fused kernel over a set of tables;
* :func:`measure_in_rounds` / :func:`measure_plans` measure plans against each other in
  interleaved rounds.

Every measurement is kept by :class:`torchrec_dreamshard.store.CostStore`, the layer above.
"""

from torchrec_dreamshard.data.tasks import random_placement
from torchrec_dreamshard.measure.comm import AllToAllCost
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.embedding_kernels import REFERENCE_TABLES, time_fused_kernel
from torchrec_dreamshard.measure.hardware import hardware_fingerprint
from torchrec_dreamshard.measure.measurements import DeviceCost, PlacementMeasurement
from torchrec_dreamshard.measure.placement_timing import BACKENDS, measure_placement, measure_plans
from torchrec_dreamshard.measure.rounds import balanced_order, measure_in_rounds, round_order

__all__ = [
    "BACKENDS",
    "AllToAllCost",
    "DeviceCost",
    "MeasureConfig",
    "PlacementMeasurement",
    "REFERENCE_TABLES",
    "balanced_order",
    "hardware_fingerprint",
    "measure_in_rounds",
    "measure_placement",
    "measure_plans",
    "random_placement",
    "round_order",
    "time_fused_kernel",
]
