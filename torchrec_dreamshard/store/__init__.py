"""The SQLite cost dataset: every measurement kept, read back as training examples
(:class:`CostStore`), its file and lock, and the inputs running jobs fed their tables.
"""

from torchrec_dreamshard.store.cost_store import CostStore, DeviceExample, PlacementExample

__all__ = ["CostStore", "DeviceExample", "PlacementExample"]
