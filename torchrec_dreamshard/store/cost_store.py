"""The cost dataset (:class:`CostStore`): every measurement appended to SQLite, one
transaction each under a unique ``job`` key that lets a collection resume, read back as
training examples of one (hardware fingerprint, workload) group."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task, device_tables
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.hardware import fingerprint_key, hardware_fingerprint
from torchrec_dreamshard.measure.measurements import DeviceCost, PlacementMeasurement
from torchrec_dreamshard.measure.summary import reference_scales
from torchrec_dreamshard.store.collector_lock import collector_lock
from torchrec_dreamshard.store.sqlite_file import connect, sqlite_errors

__all__ = ["CostStore", "DeviceExample", "PlacementExample"]

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at REAL NOT NULL,
    job TEXT UNIQUE,
    fingerprint_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    workload_key TEXT NOT NULL,
    workload TEXT NOT NULL,
    protocol TEXT NOT NULL,
    backend TEXT NOT NULL,
    task TEXT NOT NULL,
    placement TEXT NOT NULL,
    ok INTEGER NOT NULL,
    error TEXT,
    step_ms REAL,
    spread REAL,
    reference_ms REAL,
    comm_source TEXT,
    per_device TEXT NOT NULL,
    extra TEXT
);
CREATE INDEX IF NOT EXISTS by_group ON measurements (fingerprint_key, workload_key, ok);
"""


@dataclass
class DeviceExample:
    """One device of a measured placement: its table set and cost (empty devices included)."""

    tables: list[TableSpec]
    batch_size: int
    num_devices: int
    fwd_ms: float
    bwd_ms: float
    comm_ms: float
    reference_ms: float = float("nan")


@dataclass
class PlacementExample:
    """A whole measured placement and its step cost."""

    task: Task
    placement: list[int]
    per_device: list[DeviceCost]
    step_ms: float
    reference_ms: float = float("nan")
    meta: dict[str, Any] = field(default_factory=dict)


class CostStore:
    """A SQLite cost dataset at ``path`` (created if missing).

    Example::

        with CostStore("costs.sqlite") as store:
            store.append(task, placement, measurement, config, job="it0-task0-0")
            examples = store.placement_examples()
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._conn = connect(self.path, _SCHEMA, SCHEMA_VERSION)
        self._fingerprints: dict[tuple[str, str, str], dict[str, Any]] = {}

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> CostStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tables beside the measurements ------------------------------------------------

    def add_table(self, schema: str) -> None:
        """Create another part's table in this file (``CREATE TABLE IF NOT EXISTS`` ``schema``)."""
        with sqlite_errors(self.path), self._conn:
            self._conn.executescript(schema)

    def has_table(self, name: str) -> bool:
        """Whether the file holds table ``name``."""
        query = "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?"
        with sqlite_errors(self.path):
            return self._conn.execute(query, (name,)).fetchone() is not None

    def write_rows(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run ``sql`` once per row, all in one transaction."""
        with sqlite_errors(self.path), self._conn:
            self._conn.executemany(sql, rows)

    def read_rows(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        """The rows ``sql`` selects."""
        with sqlite_errors(self.path):
            return self._conn.execute(sql, args).fetchall()

    # -- writing ---------------------------------------------------------------------------

    def append(
        self,
        task: Task,
        placement: Sequence[int],
        measurement: PlacementMeasurement,
        config: MeasureConfig,
        job: str | None = None,
    ) -> int:
        """Append one measurement, failed ones too, in one transaction; returns the row id.

        Args:
            job: an optional unique key (a collection's job), used to resume.
        """
        m = measurement
        fp = self.fingerprint(config, m.backend)
        row = {
            "created_at": time.time(),
            "job": job,
            "fingerprint_key": fingerprint_key(fp),
            "fingerprint": json.dumps(fp, sort_keys=True),
            "workload_key": config.workload_key(task.batch_size),
            "workload": json.dumps(config.workload(task.batch_size), sort_keys=True),
            "protocol": json.dumps(config.protocol(), sort_keys=True),
            "backend": m.backend,
            "task": json.dumps(task.to_dict()),
            "placement": json.dumps([int(d) for d in placement]),
            "ok": int(bool(m.ok)),
            "error": m.error,
            "step_ms": _num(m.step_ms),
            "spread": _num(m.spread),
            "reference_ms": _num(m.reference_ms),
            "comm_source": m.comm_source,
            "per_device": json.dumps([d.to_dict() for d in m.per_device]),
            "extra": json.dumps(m.extra),
        }
        sql = f"INSERT INTO measurements ({', '.join(row)}) VALUES ({','.join('?' * len(row))})"
        try:
            with self._conn:
                cur = self._conn.execute(sql, tuple(row.values()))
        except sqlite3.IntegrityError:
            raise ValueError(
                f"cost store {str(self.path)!r} already holds job {job!r}: another process "
                "wrote it (collect with one process per store)"
            ) from None
        return int(cur.lastrowid)

    def forget_jobs(self, jobs: Sequence[str]) -> int:
        """Delete the rows of ``jobs`` in one transaction; returns how many went."""
        jobs = list(jobs)
        with self._conn:
            cur = self._conn.executemany(
                "DELETE FROM measurements WHERE job = ?", [(j,) for j in jobs]
            )
        return int(cur.rowcount)

    def fingerprint(self, config: MeasureConfig, backend: str = "local") -> dict[str, Any]:
        """The fingerprint rows measured with ``config`` on ``backend`` are stored under."""
        key = (config.device, backend, json.dumps(config.protocol(), sort_keys=True))
        if key not in self._fingerprints:
            self._fingerprints[key] = hardware_fingerprint(config, backend)
        return self._fingerprints[key]

    def collector_lock(self, who: str) -> contextlib.AbstractContextManager[None]:
        """Hold the store's collector lock (:func:`~.collector_lock.collector_lock`)."""
        return collector_lock(self.path, who)

    # -- counting --------------------------------------------------------------------------

    def count(
        self,
        fingerprint: str | dict | None = None,
        workload: str | None = None,
        ok: bool | None = None,
        job_prefix: str | None = None,
    ) -> int:
        """Rows matching every filter given (fingerprint, workload, ok, ``job_prefix``)."""
        where, args = _where(fingerprint, workload, ok, job_prefix)
        sql = "SELECT COUNT(*) FROM measurements" + where
        return int(self._conn.execute(sql, args).fetchone()[0])

    def done_jobs(self, job_prefix: str, fingerprint: str | dict | None = None) -> set[str]:
        """Job keys recorded that start with ``job_prefix`` (on ``fingerprint``'s hardware)."""
        where, args = _where(fingerprint, None, None, job_prefix)
        rows = self._conn.execute("SELECT job FROM measurements" + where, args)
        return {r[0] for r in rows}

    def groups(self) -> list[dict[str, Any]]:
        """Every (fingerprint, workload) group with its row counts."""
        rows = self._conn.execute(
            "SELECT fingerprint_key, workload_key, fingerprint, COUNT(*), SUM(ok) "
            "FROM measurements GROUP BY fingerprint_key, workload_key ORDER BY 1, 2"
        )
        return [
            {
                "fingerprint": fk,
                "workload": wk,
                "hardware": json.loads(fp),
                "rows": n,
                "ok_rows": int(n_ok or 0),
            }
            for fk, wk, fp, n, n_ok in rows
        ]

    # -- reading examples ------------------------------------------------------------------

    def placement_examples(
        self,
        fingerprint: str | dict | None = None,
        workload: str | None = None,
        normalise: bool = False,
    ) -> list[PlacementExample]:
        """Every successful measurement of one (fingerprint, workload) group.

        Args:
            fingerprint: a fingerprint key (see :meth:`groups`) or dict; optional where the
                store holds one group.
            workload: a workload key (``MeasureConfig.workload_key``); optional likewise.
            normalise: scale each row by ``median reference / row reference``.

        Raises:
            ValueError: the rows selected span several groups (they are listed).
        """
        rows = self._select(fingerprint, workload)
        refs = [r["reference_ms"] for r in rows]
        scale = reference_scales(refs) if normalise else [1.0] * len(rows)
        out = []
        for row, s in zip(rows, scale, strict=True):
            task = Task.from_dict(json.loads(row["task"]))
            per_device = [DeviceCost.from_dict(d) for d in json.loads(row["per_device"])]
            per_device = [
                DeviceCost(d.fwd_ms * s, d.bwd_ms * s, d.comm_ms * s, d.spread, d.num_tables)
                for d in per_device
            ]
            out.append(
                PlacementExample(
                    task=task,
                    placement=json.loads(row["placement"]),
                    per_device=per_device,
                    step_ms=row["step_ms"] * s,
                    reference_ms=row["reference_ms"],
                    meta={"id": row["id"], "backend": row["backend"], "job": row["job"]},
                )
            )
        return out

    def device_examples(
        self,
        fingerprint: str | dict | None = None,
        workload: str | None = None,
        normalise: bool = False,
    ) -> list[DeviceExample]:
        """Per-device table sets with their fwd, bwd and comm ms (as :meth:`placement_examples`)."""
        out = []
        for ex in self.placement_examples(fingerprint, workload, normalise):
            groups = device_tables(ex.task, ex.placement)
            for idx, cost in zip(groups, ex.per_device, strict=True):
                out.append(
                    DeviceExample(
                        tables=[ex.task.tables[i] for i in idx],
                        batch_size=ex.task.batch_size,
                        num_devices=ex.task.num_devices,
                        fwd_ms=cost.fwd_ms,
                        bwd_ms=cost.bwd_ms,
                        comm_ms=cost.comm_ms,
                        reference_ms=ex.reference_ms,
                    )
                )
        return out

    def _select(self, fingerprint, workload) -> list[sqlite3.Row]:
        where, args = _where(fingerprint, workload, True)
        self._conn.row_factory = sqlite3.Row
        try:
            rows = self._conn.execute(
                "SELECT * FROM measurements" + where + " ORDER BY id", args
            ).fetchall()
        finally:
            self._conn.row_factory = None
        found = sorted({(r["fingerprint_key"], r["workload_key"]) for r in rows})
        if len(found) > 1:
            listing = "; ".join(
                f"fingerprint={g['fingerprint']} workload={g['workload']} "
                f"({g['ok_rows']} rows, {g['hardware'].get('device_name')})"
                for g in self.groups()
                if (g["fingerprint"], g["workload"]) in found
            )
            raise ValueError(
                f"cost store {str(self.path)!r} holds rows from {len(found)} hardware/workload "
                f"groups; pick one with fingerprint=... and workload=...: {listing}"
            )
        return rows


def _num(x: float) -> float | None:
    return None if x is None or x != x else float(x)


def _where(fingerprint, workload, ok, job_prefix=None) -> tuple[str, list[Any]]:
    """The ``WHERE`` clause of the filters given (empty: none) and its arguments."""
    if isinstance(fingerprint, dict):
        fingerprint = fingerprint_key(fingerprint)
    filters = {
        "fingerprint_key = ?": fingerprint,
        "workload_key = ?": workload,
        "ok = ?": None if ok is None else int(ok),
    }
    if job_prefix is not None:
        escaped = job_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        filters["job LIKE ? ESCAPE '\\'"] = escaped + "%"
    given = {sql: arg for sql, arg in filters.items() if arg is not None}
    return (" WHERE " + " AND ".join(given) if given else ""), list(given.values())
