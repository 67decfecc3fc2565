"""Process groups of ranks spawned on this machine (gloo on CPU): the measurement backend,
the all-to-all calibration, the demo and the tests all start ranks this way."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


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
    group is destroyed when the block ends, however it ends."""
    import torch.distributed as dist

    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        yield
    finally:
        dist.destroy_process_group()
