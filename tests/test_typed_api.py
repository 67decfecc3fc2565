"""The public API is typed: a type checker sees ``DreamShardPlanner``'s and ``observe``'s
real signatures through the package root (its lazy ``__getattr__`` would give ``Any``)
and finds the package as an installed one, by its ``py.typed`` marker (PEP 561).

mypy runs in a subprocess, from a temporary folder, with the repository on
``PYTHONPATH``: mypy then looks the package up as it looks up an installed package (it
must carry ``py.typed``), not as the user's own code. TorchRec, torch and the other
heavy dependencies are not followed (their types are ``Any``), so the check takes seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

CONFIG = """\
[mypy]
ignore_missing_imports = True
follow_imports = silent
incremental = False
cache_dir = {cache}

[mypy-torch.*,torchrec.*,fbgemm_gpu.*,numpy.*,matplotlib.*,tensordict.*,torchmetrics.*]
follow_imports = skip
"""

# What a user writes: TorchRec's arguments, then DreamShard's options by keyword.
CORRECT = """\
from torchrec.distributed.planner.types import Topology

from torchrec_dreamshard import DreamShardPlanner, observe

planner = DreamShardPlanner(
    topology=Topology(world_size=2, compute_device="cpu"),
    batch_size=512,
    mode="greedy",
    calibrate=30.0,
)
reveal_type(DreamShardPlanner)
reveal_type(observe)
"""

# Each line one mistake the signature catches.
WRONG = """\
from torchrec_dreamshard import DreamShardPlanner

DreamShardPlanner(mode="fast")
DreamShardPlanner(calibrate="30")
DreamShardPlanner(
    None, 512, None, None, None, None, None, None, None, True, None, None, None, 0.15, "ckpt"
)
"""


def _mypy(tmp_path: Path, **scripts: str) -> list[str]:
    """mypy's report lines on ``scripts`` (file stem -> source), run from ``tmp_path``."""
    try:
        import mypy  # noqa: F401
    except ModuleNotFoundError:
        pytest.fail("mypy is a test dependency (requirements.txt): run `make install`")
    config = tmp_path / "mypy.ini"
    config.write_text(CONFIG.format(cache=tmp_path / "cache"))
    files = []
    for stem, source in scripts.items():
        (tmp_path / f"{stem}.py").write_text(textwrap.dedent(source))
        files.append(f"{stem}.py")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MYPYPATH", None)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), *files],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert not done.stderr.strip(), done.stderr
    return done.stdout.splitlines()


def test_type_checkers_see_the_public_signatures(tmp_path: Path) -> None:
    lines = _mypy(tmp_path, correct=CORRECT, wrong=WRONG)
    report = "\n".join(lines)

    correct = [line for line in lines if line.startswith("correct.py:")]
    assert not [line for line in correct if ": error:" in line], report
    revealed = [line for line in correct if "Revealed type is" in line]
    assert len(revealed) == 2, report
    planner, observe = revealed
    assert '"Any"' not in planner and '"Any"' not in observe, report
    assert "mode: Literal['safe']" in planner, report
    assert planner.endswith('-> torchrec_dreamshard.planner.planners.DreamShardPlanner"'), report
    assert observe.endswith('-> torchrec_dreamshard.feedback.observer.JobObserver"'), report

    errors = {
        int(line.split(":")[1]): line
        for line in lines
        if line.startswith("wrong.py:") and ": error:" in line
    }
    assert set(errors) == {3, 4, 5}, report
    assert '"mode"' in errors[3] and "Literal['fast']" in errors[3], errors[3]
    assert '"calibrate"' in errors[4], errors[4]
    assert "Too many positional arguments" in errors[5], errors[5]


def test_the_package_ships_its_marker() -> None:
    """``py.typed`` is in the package and in setup.py's package data."""
    assert (REPO / "torchrec_dreamshard" / "py.typed").is_file()
    assert '"py.typed"' in (REPO / "setup.py").read_text()
