"""Where the planner's caches live (:func:`cache_root`): the directory of the innermost
:func:`using_cache_dir` block around the call (a context variable: scoped to the code inside
it, this thread only), else ``$XDG_CACHE_HOME/torchrec_dreamshard`` or ``~/.cache/...``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

APP_DIR = "torchrec_dreamshard"  # the package's folder under $XDG_CACHE_HOME

_CACHE_DIR: ContextVar[Path | None] = ContextVar("torchrec_dreamshard_cache_dir", default=None)


@contextlib.contextmanager
def using_cache_dir(path: str | os.PathLike | None) -> Iterator[Path | None]:
    """Within the block, every cache of the package lives in ``path`` (created when first
    written); ``None`` changes nothing.

    Yields:
        The directory the block uses (``None`` where ``path`` is ``None``).

    Raises:
        ValueError: ``path`` is empty or names something that is not a directory.
    """
    if path is None:
        yield None
        return
    directory = checked_cache_dir(path)
    token = _CACHE_DIR.set(directory)
    try:
        yield directory
    finally:
        _CACHE_DIR.reset(token)


def checked_cache_dir(path: str | os.PathLike) -> Path:
    """``path`` as a cache directory, ``~`` expanded and absolute.

    Raises:
        ValueError: ``path`` is not a path, is empty, or exists and is not a directory.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"cache_dir must be a path, got {type(path).__name__} {path!r}")
    if not os.fspath(path):
        raise ValueError("cache_dir is empty; give a directory")
    directory = Path(path).expanduser().absolute()
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"cache_dir {str(directory)!r} exists and is not a directory")
    return directory


def cache_dir_override() -> Path | None:
    """The directory of the innermost :func:`using_cache_dir` block (``None``: none)."""
    return _CACHE_DIR.get()


def default_cache_root() -> Path:
    """``$XDG_CACHE_HOME/torchrec_dreamshard``, or ``~/.cache/torchrec_dreamshard``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / APP_DIR


def cache_root() -> Path:
    """The directory the caches live in here and now."""
    override = _CACHE_DIR.get()
    return override if override is not None else default_cache_root()


def cache_root_source() -> str:
    """What chose :func:`cache_root`: ``"cache_dir"``, ``"$XDG_CACHE_HOME"`` or ``"~/.cache"``."""
    if _CACHE_DIR.get() is not None:
        return "cache_dir"
    return "$XDG_CACHE_HOME" if os.environ.get("XDG_CACHE_HOME") else "~/.cache"
