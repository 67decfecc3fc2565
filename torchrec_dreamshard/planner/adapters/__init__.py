"""The adapters to TorchRec: task files as TorchRec's inputs, the topology, device memory
as TorchRec counts it, and the one module that reads TorchRec's planner.
"""
