"""The cost store's collector lock: one collecting process per store file."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def collector_lock(path: Path, who: str) -> Iterator[None]:
    """Hold the store's collector lock (an ``flock`` on ``PATH.lock``): one collector per store.

    Raises:
        ValueError: another process holds the lock (its pid and command are named).
    """
    lock_path = path.with_name(path.name + ".lock")
    f = open(lock_path, "a+")  # noqa: SIM115 - held open for the block
    try:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown process"
            raise ValueError(
                f"cost store {str(path)!r} is being collected into by another "
                f"process ({holder}); wait for it to finish or use another store"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}: {who}")
        f.flush()
        yield
    finally:
        f.close()  # closing the file releases the lock
