"""Ranks started as fresh interpreters (``python -m MODULE JOB``); one that fails or outlives
the deadline ends them all (:class:`RankProcessError`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from torchrec_dreamshard.ranks.spawn import launcher_free_env

STDERR_CHARS = 2000  # of a failed rank's stderr kept in the error


class RankProcessError(RuntimeError):
    """A fresh-interpreter rank could not start, failed, or did not finish in time."""


def rank_env() -> dict[str, str]:
    """This environment, the package's folder first on ``PYTHONPATH``, one intra-op thread."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the folder holding the package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_module_ranks(
    module: str, job: dict[str, Any], tmp: Path, timeout_s: float, what: str
) -> None:
    """Start ``job["world"]`` ranks of ``module``, wait for all.

    Args:
        module: the module each rank runs; its one argument is ``job`` as JSON with ``"rank"``.
        job: JSON-able, with ``"world"``, the number of ranks.
        tmp: a directory for the ranks' stderr files.
        timeout_s: how long all ranks may take together.
        what: the ranks' name in errors (``"sharding-path"``).

    Raises:
        RankProcessError: a rank could not start or failed, or the ranks overran ``timeout_s``.
    """
    procs: list[subprocess.Popen] = []
    logs: list[Any] = []
    try:
        _start_ranks(module, job, tmp, procs, logs, what)
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed:
                raise RankProcessError(_failure(failed[0], procs, logs, what))
            if time.monotonic() > deadline:
                raise RankProcessError(f"the {what} ranks did not finish in {timeout_s:g} s")
            time.sleep(0.05)
        failed = [r for r, p in enumerate(procs) if p.returncode != 0]
        if failed:
            raise RankProcessError(_failure(failed[0], procs, logs, what))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()


def _start_ranks(
    module: str, job: dict[str, Any], tmp: Path, procs: list, logs: list, what: str
) -> None:
    with launcher_free_env():
        env = rank_env()
        for rank in range(job["world"]):
            log = open(tmp / f"rank{rank}.err", "w+")  # noqa: SIM115 - the caller closes it
            logs.append(log)
            args = [sys.executable, "-m", module, json.dumps({**job, "rank": rank})]
            try:
                procs.append(subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=log))
            except OSError as exc:  # no fork or exec allowed here, no memory, ...
                raise RankProcessError(f"could not start a {what} rank: {exc}") from exc


def _failure(rank: int, procs: list[subprocess.Popen], logs: list[Any], what: str) -> str:
    logs[rank].seek(0)
    text = logs[rank].read()[-STDERR_CHARS:].strip()
    return f"{what} rank {rank} exited with status {procs[rank].returncode}: {text}"
