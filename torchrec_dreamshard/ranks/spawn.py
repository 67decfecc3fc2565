"""Process groups of ranks spawned on this machine (gloo on CPU), and the rule that
nothing is spawned inside a distributed job (:func:`check_may_spawn`, :func:`skip_measuring`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for a spawned group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def local_process_group(
    rank: int, world_size: int, port: int, backend: str = "gloo"
) -> Iterator[None]:
    """Join the group of ``world_size`` spawned ranks at ``127.0.0.1:port``, destroyed when
    the block ends (after a barrier when it ends normally)."""
    import torch.distributed as dist

    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()


def exit_spawned_rank() -> NoReturn:
    """End a spawned rank that finished its work with status 0, skipping C++ static destructors."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# What a launcher (torchrun, torchelastic, ...) sets for its ranks; spawned groups run without them.
_LAUNCHER_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_ASYNC_ERROR_HANDLING",
)
_LAUNCHER_PREFIXES = ("TORCHELASTIC_", "TORCH_ELASTIC_")


@contextlib.contextmanager
def launcher_free_env() -> Iterator[None]:
    """Within the block, ``os.environ`` holds no launcher rendezvous variables; restored after."""
    saved = {
        k: v
        for k, v in os.environ.items()
        if k in _LAUNCHER_VARS or k.startswith(_LAUNCHER_PREFIXES)
    }
    for k in saved:
        del os.environ[k]
    try:
        yield
    finally:
        os.environ.update(saved)


def in_distributed_job() -> bool:
    """Whether this process is a rank of an initialised ``torch.distributed`` job."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def measuring_ranks(wanted: int) -> int:
    """Ranks to spawn for a measurement: ``wanted``, at most the machine's cores, at least 2."""
    return max(2, min(wanted, os.cpu_count() or 2))


def check_may_spawn(what: str) -> None:
    """Raise a ``ValueError`` when ``what`` would spawn processes inside a distributed job."""
    if in_distributed_job():
        raise ValueError(
            f"{what} would spawn processes from inside a distributed job; plan with "
            "DreamShardPlanner.collective_plan(model, sharders, pg), which measures it on "
            "the job's own process group, or measure it once outside the job"
        )


def skip_measuring(cache_file: Path, fallback: str) -> bool:
    """Whether a fit cached in ``cache_file`` must not be measured here: inside a distributed
    job with no cached fit (then logs that ``fallback`` stands in)."""
    if not in_distributed_job() or cache_file.exists():
        return False
    logging.getLogger(__name__).info(
        "%s: this rank of a running job has no cached fit (%s) and measures none on its own; "
        "DreamShardPlanner.collective_plan measures it on the job's own group",
        fallback,
        cache_file.name,
    )
    return True
