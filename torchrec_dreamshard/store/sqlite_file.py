"""The cost store's SQLite file: opening it (WAL, full sync, schema and version), its errors
as a ``ValueError`` naming the file."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def sqlite_errors(path: str | Path) -> Iterator[None]:
    """SQLite's errors on the store at ``path`` as a ``ValueError`` naming the file."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"{str(path)!r} is not a usable SQLite cost store: {exc}") from None


def connect(path: Path, schema: str, version: int) -> sqlite3.Connection:
    """A connection to the store at ``path`` (created if missing) holding ``schema`` at ``version``.

    Raises:
        ValueError: ``path`` is a directory or its folder is missing, the file is not SQLite,
            or it records another schema version.
    """
    if path.exists() and path.is_dir():
        raise ValueError(f"cost store path {str(path)!r} is a directory, not a file")
    if not path.parent.exists():
        raise ValueError(f"cost store path {str(path)!r}: folder does not exist")
    conn = sqlite3.connect(str(path), timeout=30.0)
    try:
        with sqlite_errors(path):
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            with conn:
                conn.executescript(schema)
                found = conn.execute("PRAGMA user_version").fetchone()[0]
                if found == 0:
                    conn.execute(f"PRAGMA user_version={version}")
                elif found != version:
                    raise ValueError(
                        f"cost store {str(path)!r} has schema {found}, this code reads {version}"
                    )
    except ValueError:
        conn.close()
        raise
    return conn
