"""The adapters to TorchRec: task files as its inputs, the topology, device memory, its planner."""
