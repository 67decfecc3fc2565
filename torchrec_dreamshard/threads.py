"""Running torch on one intra-op thread."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def single_thread(enabled: bool = True) -> Iterator[None]:
    """Run the block (or decorated function) on one intra-op thread, restored after
    (``enabled=False``: the threads as they are)."""
    before = torch.get_num_threads()
    if enabled:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
