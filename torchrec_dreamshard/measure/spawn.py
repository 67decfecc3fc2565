"""Process groups of ranks spawned on this machine (gloo on CPU): the measurement backend,
the all-to-all calibration, the demo and the tests all start ranks this way."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Iterator
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
    """Join the group of ``world_size`` spawned ranks meeting at ``127.0.0.1:port``; the
    group is destroyed when the block ends, however it ends.

    A block that ends normally first waits at a barrier, so that no rank tears its group
    down while a peer still finishes a collective with it.
    """
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
    """End a spawned rank that finished its work, skipping C++ static destructors.

    After training under ``DistributedModelParallel`` on gloo, about one process exit in
    six or seven aborted in a native thread with "terminate called without an active
    exception" (no Python frame; every rank had already written its results), which
    ``mp.spawn`` reports as a failure. Ranks that call this once their results are written
    exit with status 0 without running those destructors.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
