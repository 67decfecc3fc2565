"""The demo as a benchmark: ``dreamshard demo`` with its side-by-side written to
``benchmarks/results/demo.json`` (and the printed output to ``demo.txt``).

    .venv/bin/python benchmarks/demo.py [--checkpoint PATH]
"""

from __future__ import annotations

import contextlib
import io
import sys

from torchrec_dreamshard.cli import main as dreamshard

from harness.results_files import RESULTS


def main() -> int:
    RESULTS.mkdir(parents=True, exist_ok=True)
    printed = io.StringIO()

    class Tee(io.TextIOBase):
        def write(self, s: str) -> int:
            sys.__stdout__.write(s)
            return printed.write(s)

    with contextlib.redirect_stdout(Tee()):
        rc = dreamshard(["demo", "--out", str(RESULTS / "demo.json"), *sys.argv[1:]])
    (RESULTS / "demo.txt").write_text(printed.getvalue())
    return rc


if __name__ == "__main__":
    sys.exit(main())
