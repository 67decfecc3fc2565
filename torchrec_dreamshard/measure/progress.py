"""Progress bars for measuring, shown on a terminal once measuring takes a while."""

from __future__ import annotations

import sys
from typing import Any

PROGRESS_DELAY_S = 3.0  # a progress bar shows once measuring has taken this long


def progress_bar(total: int, desc: str, enabled: bool, verbose: bool = False) -> Any:
    """A tqdm bar on stderr, shown after :data:`PROGRESS_DELAY_S` where stderr is a terminal
    (or ``verbose``); ``None`` when not ``enabled``."""
    if not enabled:
        return None
    from tqdm import tqdm

    shown = verbose or bool(getattr(sys.stderr, "isatty", lambda: False)())
    return tqdm(
        total=total,
        desc=desc,
        leave=False,
        file=sys.stderr,
        delay=PROGRESS_DELAY_S,
        disable=not shown,
    )
