"""A loader for files of Meta's open DLRM embedding dataset."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from torchrec_dreamshard.data.table_stats import access_stats
from torchrec_dreamshard.data.tables import TableSpec


@dataclass
class DatasetTable:
    """A table read from a dataset file: its spec and its id stream."""

    spec: TableSpec
    ids: torch.Tensor
    offsets: torch.Tensor


def load_dlrm_dataset(
    path: str | Path,
    dim: int | Sequence[int] = 64,
    tables: Sequence[int] | None = None,
    prefix: str = "dlrm",
) -> list[DatasetTable]:
    """The tables of a file of Meta's open DLRM embedding dataset (e.g.
    ``fbgemm_t856_bs65536.pt``: ``(indices, offsets, lengths)`` table-major, read with
    ``weights_only=True``); rows are the largest id + 1, tables with no ids skipped.

    Args:
        dim: embedding dim for every table, or one per table of the file.
        tables: indices of the tables to read (default all).
        prefix: table names are ``f"{prefix}_{index:03d}"``.
    """
    try:
        data = torch.load(Path(path), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"dataset file {str(path)!r} does not exist") from None
    except Exception as exc:  # unpickling errors come in many types
        raise ValueError(f"dataset file {str(path)!r} could not be read safely: {exc}") from None
    if not (isinstance(data, list | tuple) and len(data) == 3):
        raise ValueError(f"dataset file {str(path)!r} must hold (indices, offsets, lengths)")
    indices, offsets, lengths = (torch.as_tensor(x) for x in data)
    if lengths.dim() != 2:
        raise ValueError(f"dataset file {str(path)!r}: lengths must be [tables, batch]")
    num_tables, batch = lengths.shape
    if offsets.numel() != num_tables * batch + 1:
        raise ValueError(
            f"dataset file {str(path)!r}: offsets has {offsets.numel()} entries, "
            f"expected tables*batch+1 = {num_tables * batch + 1}"
        )
    dims = [dim] * num_tables if isinstance(dim, int) else list(dim)
    if len(dims) != num_tables:
        raise ValueError(f"got {len(dims)} dims for {num_tables} tables")
    out = []
    for t in range(num_tables) if tables is None else tables:
        if not 0 <= t < num_tables:
            raise ValueError(f"table index {t} out of range 0..{num_tables - 1}")
        lo, hi = int(offsets[t * batch]), int(offsets[(t + 1) * batch])
        if hi == lo:
            continue
        ids = indices[lo:hi].to(torch.int64)
        local = (offsets[t * batch : (t + 1) * batch + 1] - lo).to(torch.int64)
        pooling, hist = access_stats(ids, local)
        spec = TableSpec(
            name=f"{prefix}_{t:03d}",
            rows=int(ids.max()) + 1,
            dim=int(dims[t]),
            pooling_factor=pooling,
            reuse_hist=hist,
        )
        out.append(DatasetTable(spec=spec, ids=ids, offsets=local))
    return out
