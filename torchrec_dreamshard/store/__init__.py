"""The SQLite cost dataset: every measurement kept, read back as training examples.

* :class:`CostStore` appends each measured placement in its own transaction and reads
  training examples back (:class:`DeviceExample`, :class:`PlacementExample`); other parts
  keep their tables in the same file beside the measurements;
* :mod:`~.sqlite_file`: the file's one connection, its schema, and SQLite's errors on it;
* :mod:`~.collector_lock`: one collecting process per store file;
* :mod:`~.fed_inputs_store`: what running jobs fed their tables, kept in the store's file
  for the next plan of the same model.
"""

from torchrec_dreamshard.store.cost_store import CostStore, DeviceExample, PlacementExample

__all__ = ["CostStore", "DeviceExample", "PlacementExample"]
