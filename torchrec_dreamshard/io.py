"""Files in and out: atomic writes (a fsynced temporary file renamed over the target) and
strict JSON reads (every way a user's file can be wrong a ``ValueError`` naming it)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

MAX_JSON_BYTES = 256 * 2**20  # the largest JSON file we read (bytes)
MAX_JSON_DEPTH = 64  # the deepest nesting of arrays and objects we accept


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _depth_ok(text: str) -> bool:
    """Whether brackets nest at most MAX_JSON_DEPTH deep (strings are skipped)."""
    depth, in_str, escaped = 0, False, False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def loads_strict(text: str) -> Any:
    """``json.loads`` refusing (a ``ValueError``) duplicate keys, ``NaN``/``Infinity``,
    nesting deeper than ``MAX_JSON_DEPTH`` and integers over Python's digit limit."""
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and not _depth_ok(text):
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep") from None
    except ValueError as exc:  # duplicate keys, constants, integers over the digit limit
        raise ValueError(str(exc).split("; use sys.set_int_max_str_digits")[0]) from None


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of ``path``; every failure a ``ValueError`` naming ``what`` and it."""
    where = f"{what} {str(path)!r}"
    p = Path(path)
    try:
        if p.is_dir():
            raise ValueError(f"{where} is a directory, not a file")
        if not p.exists():
            raise ValueError(f"{where} does not exist")
        if p.stat().st_size > MAX_JSON_BYTES:
            raise ValueError(f"{where} is larger than {MAX_JSON_BYTES} bytes")
        return p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    except OSError as exc:
        raise ValueError(f"{where} could not be read: {exc.strerror or exc}") from None


def read_json(path: str | Path, what: str) -> Any:
    """The JSON value in ``path`` read strictly (:func:`loads_strict`); every way the file
    can be wrong a ``ValueError`` naming ``what`` (``"task file"``) and the path."""
    text = read_text(path, what)
    try:
        return loads_strict(text)
    except ValueError as exc:
        raise ValueError(f"{what} {str(path)!r}: {exc}") from None


def dumps_strict(data: Any, indent: int | None = 1) -> str:
    """JSON text of ``data``; a non-finite float is a ``ValueError`` (never a bare NaN)."""
    try:
        return json.dumps(data, indent=indent, allow_nan=False) + "\n"
    except ValueError as exc:
        raise ValueError(f"refusing to write non-finite numbers as JSON: {exc}") from None


def check_writable(path: str | Path, what: str) -> None:
    """A ``ValueError`` (before any long work) where ``path`` cannot be written."""
    p = Path(path)
    where = f"{what} {str(path)!r}"
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise ValueError(f"{where} is a directory; give a file name")
    if not parent.exists():
        raise ValueError(f"{where}: folder {str(parent)!r} does not exist")
    if not parent.is_dir():
        raise ValueError(f"{where}: {str(parent)!r} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{where}: folder {str(parent)!r} is not writable")
    if p.exists() and not os.access(p, os.W_OK):
        raise ValueError(f"{where} exists and is not writable")


@contextlib.contextmanager
def atomic_path(path: str | Path, what: str = "output file") -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix), renamed over it after an fsync when
    the block ends without an exception, removed otherwise."""
    p = Path(path)
    check_writable(p, what)
    folder = p.parent if str(p.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{p.name}.", suffix=p.suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; our outputs are plain data
        os.replace(tmp, p)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write(path: str | Path, data: str | bytes, what: str = "output file") -> None:
    """Write ``data`` (text as UTF-8) to ``path`` atomically."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_path(path, what) as tmp, open(tmp, "wb") as f:
        f.write(raw)
        f.flush()


def atomic_write_with(path: str | Path, writer: Callable[[IO[str]], None], what: str) -> None:
    """Write ``path`` atomically through ``writer(file)`` (a text file opened for it)."""
    with atomic_path(path, what) as tmp, open(tmp, "w", newline="") as f:
        writer(f)
        f.flush()


def save_figure(fig, path: str | Path, what: str = "plot file", dpi: int = 100) -> None:
    """Save a matplotlib figure atomically (see :func:`atomic_path`) and close it."""
    import matplotlib.pyplot as plt

    try:
        with atomic_path(path, what) as tmp:
            fig.savefig(tmp, dpi=dpi)
    finally:
        plt.close(fig)
