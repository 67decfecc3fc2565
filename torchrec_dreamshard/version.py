"""The package's version, a leaf module (importing it does not reach the planner)."""

__version__ = "0.1.0"
