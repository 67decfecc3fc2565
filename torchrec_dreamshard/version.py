"""The package's version: a leaf the policy's checkpoints and the training loop record,
so that they need not import the package root (which reaches the planner)."""

__version__ = "0.1.0"
