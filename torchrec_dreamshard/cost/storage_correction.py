"""``StorageCorrection``: factors a running job measured over TorchRec's storage estimate,
per table and per compute kernel (``DreamShardPlanner(storage_correction=...)``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

FORMAT_VERSION = 1


def _factor(what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"storage correction {what}: a number is needed, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"storage correction {what}: must be finite and > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class StorageCorrection:
    """Factors over TorchRec's storage estimate, measured in a running job.

    Attributes:
        tables: by table name, measured / estimated bytes of the table's shards.
        kernels: by compute kernel (``"fused"``, ``"dense"``, ...), the factor of a table
            not in ``tables`` (the median over the job's tables on that kernel).
        source: where it was learnt (shown in reports).
    """

    tables: Mapping[str, float] = field(default_factory=dict)
    kernels: Mapping[str, float] = field(default_factory=dict)
    source: str = ""

    def __post_init__(self) -> None:
        tables = {str(k): _factor(f"table {k!r}", v) for k, v in dict(self.tables).items()}
        kernels = {str(k): _factor(f"kernel {k!r}", v) for k, v in dict(self.kernels).items()}
        object.__setattr__(self, "tables", tables)
        object.__setattr__(self, "kernels", kernels)

    def factor(self, table: str, kernel: str) -> float:
        """The factor of ``table`` on ``kernel``: its own, else its kernel's, else 1."""
        if table in self.tables:
            return self.tables[table]
        return self.kernels.get(kernel, 1.0)

    def corrected(self, table: str, kernel: str, estimate: int) -> int:
        """``estimate`` bytes of ``table`` on ``kernel``, corrected (rounded up)."""
        return math.ceil(estimate * self.factor(table, kernel))

    def merged(self, newer: StorageCorrection) -> StorageCorrection:
        """This correction with ``newer``'s factors over it (a later job's)."""
        return StorageCorrection(
            {**self.tables, **newer.tables},
            {**self.kernels, **newer.kernels},
            newer.source or self.source,
        )

    def fingerprint(self) -> str:
        """A short hash of the factors."""
        text = json.dumps([sorted(self.tables.items()), sorted(self.kernels.items())])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "tables": dict(self.tables),
            "kernels": dict(self.kernels),
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StorageCorrection:
        """The correction :meth:`to_dict` wrote; a ``ValueError`` naming what is wrong."""
        if not isinstance(data, Mapping):
            raise ValueError(f"storage correction: a JSON object is needed, got {data!r}")
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"storage correction: version {data.get('version')!r}, this release reads "
                f"{FORMAT_VERSION}"
            )
        for key in ("tables", "kernels"):
            if not isinstance(data.get(key, {}), Mapping):
                raise ValueError(f"storage correction: {key!r} must be an object")
        return cls(data.get("tables", {}), data.get("kernels", {}), str(data.get("source", "")))


# a correction, or what gives one when storage is estimated (a planner's profile's)
CorrectionSource = StorageCorrection | Callable[[], StorageCorrection | None]
