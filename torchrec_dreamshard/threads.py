"""Running torch on one intra-op thread."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def single_thread(enabled: bool = True) -> Iterator[None]:
    """Run the block (or decorated function) on one intra-op thread; restored after.

    Used where one CPU thread stands for one device (measurement), and around the tiny
    networks: with several OpenMP threads on a busy machine each small matrix product
    pays for spinning threads (measured 16 ms instead of 25 us per call on our 2-core
    machine under load).

    Args:
        enabled: when False the block runs with the threads as they are.
    """
    before = torch.get_num_threads()
    if enabled:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
