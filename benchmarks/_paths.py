"""Where every benchmark writes its results (kept free of heavy imports)."""

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
