"""Per-machine cache files of what is measured once on a machine and reused: the fitted
all-to-all and collective models, the dense kernel's model, the reference kernel's time.

Each lives in a JSON file of its own under ``$XDG_CACHE_HOME`` (or ~/.cache), named for
the host, the device and the torch version, so that another machine (or a torch upgrade)
measures afresh. :func:`load_cached` reads the file, or measures and writes it (atomically:
two first runs may measure at once, the last rename wins and both files are whole), and
remembers the value per path for the rest of the process.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from torchrec_dreamshard.io import atomic_write, dumps_strict, read_json
from torchrec_dreamshard.measure.config import stable_key

T = TypeVar("T")


def machine_cache_path(kind: str, device_name: str) -> Path:
    """The cache file of ``kind`` for this host, ``device_name`` and torch version."""
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    machine = stable_key([socket.gethostname(), device_name, torch.__version__])
    return base / "torchrec_dreamshard" / f"{kind}_{machine}.json"


def load_cached(
    path: Path,
    what: str,
    parse: Callable[[Any], T],
    measure: Callable[[], T],
    dump: Callable[[T], Any],
    memo: dict[str, T],
) -> T:
    """The value in ``path`` (``parse`` of its JSON), or ``measure()`` written there first
    (as ``dump`` of it); either kept in ``memo`` by path.

    Raises:
        ValueError: the file is not valid JSON or ``parse`` refuses it (the message names
            the file and says to delete it to measure again).
    """
    key = str(path)
    if key in memo:
        return memo[key]
    if path.exists():
        try:
            value = parse(read_json(path, what))  # read_json's errors name the file
        except ValueError as exc:
            text = str(exc) if key in str(exc) else f"{what}: {exc}"
            raise ValueError(f"{text}; delete {key!r} to measure again") from None
    else:
        value = measure()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, dumps_strict(dump(value)), what)
    memo[key] = value
    return value
