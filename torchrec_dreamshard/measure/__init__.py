"""Measuring placements on real FBGEMM kernels and all-to-alls, alone or plans against each
other in interleaved rounds."""

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
