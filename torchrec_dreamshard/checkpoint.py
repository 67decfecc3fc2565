"""Saving and loading a :class:`~torchrec_dreamshard.policy.DreamShard` agent.

A checkpoint is a ``torch.save`` file holding only tensors and plain Python values:

    {"format": "torchrec-dreamshard", "format_version": 1,
     "cost_net": state_dict, "policy": state_dict,
     "meta": {...}, "extra": {...}}

``meta`` carries the feature normalisation (its name, the feature size and the fixed
scales), the hardware fingerprint of the training measurements, the workload, the batch
size, the networks' width and the package version. It is read with
``torch.load(..., weights_only=True)``, so a checkpoint can never run code; every
problem (missing, truncated, corrupt, another format, another feature normalisation,
weights of the wrong shape) is a ``ValueError`` that names the file and what is wrong.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from torchrec_dreamshard import tables as _tables
from torchrec_dreamshard.cost_model import CostNet
from torchrec_dreamshard.policy import DreamShard, PolicyNet

BUNDLED_CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "cpu_default.pt"
FORMAT = "torchrec-dreamshard"
FORMAT_VERSION = 1


def feature_spec() -> dict[str, Any]:
    """The feature normalisation this package computes (a checkpoint must match it)."""
    return {
        "names": list(_tables.FEATURE_NAMES),
        "dim": _tables.FEATURE_DIM,
        "scales": dict(_tables.FEATURE_SCALES),
    }


def plain(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as plain JSON types (str subclasses such as torch's version become str),
    which is all ``weights_only`` loading accepts besides tensors."""
    return json.loads(json.dumps(data, default=str))


def save_checkpoint(agent: DreamShard, path: str | Path, extra: dict | None = None) -> None:
    """Write ``agent`` to ``path`` atomically (temporary file, then rename).

    Args:
        agent: the agent.
        path: destination file.
        extra: plain values to keep alongside (e.g. the training state to resume).
    """
    from torchrec_dreamshard import __version__

    meta = dict(agent.meta)
    meta.setdefault("version", __version__)
    meta["features"] = feature_spec()
    meta["hidden"] = agent.cost_net.hidden
    payload = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "cost_net": agent.cost_net.state_dict(),
        "policy": agent.policy.state_dict(),
        "meta": plain(meta),
        "extra": plain(dict(extra or {})),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        torch.save(payload, tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a checkpoint is plain data
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_payload(path: str | Path | None = None) -> dict[str, Any]:
    """The checked contents of a checkpoint file (``None``: the bundled one)."""
    path = Path(path) if path is not None else BUNDLED_CHECKPOINT
    where = f"checkpoint {str(path)!r}"
    if not path.is_file():
        hint = (
            " (the package was installed without its bundled checkpoint)"
            if (path == BUNDLED_CHECKPOINT)
            else ""
        )
        raise ValueError(f"{where} does not exist{hint}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated zips, pickles with code, random bytes...
        raise ValueError(
            f"{where} could not be read safely (corrupt, truncated or not a "
            f"torchrec-dreamshard checkpoint): {type(exc).__name__}: {exc}"
        ) from None
    _check_payload(payload, where)
    return payload


def _check_payload(payload: Any, where: str) -> None:
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{where} is not a torchrec-dreamshard checkpoint")
    if payload.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{where} has format version {payload.get('format_version')!r}; this package "
            f"reads version {FORMAT_VERSION}"
        )
    for key in ("cost_net", "policy", "meta"):
        if not isinstance(payload.get(key), dict):
            raise ValueError(f"{where} lacks its {key!r} section")
    features = payload["meta"].get("features")
    if features != feature_spec():
        raise ValueError(
            f"{where} was trained with another table-feature normalisation ({features!r}); "
            f"this package computes {feature_spec()!r}: retrain with `dreamshard train`"
        )


def load_checkpoint(path: str | Path | None = None) -> DreamShard:
    """Load an agent (``None``: the checkpoint bundled with the package).

    Raises:
        ValueError: the file is missing, corrupt, truncated, of another format or feature
            normalisation, or its weights do not fit the networks.
    """
    payload = read_payload(path)
    where = f"checkpoint {str(path if path is not None else BUNDLED_CHECKPOINT)!r}"
    meta = payload["meta"]
    hidden = meta.get("hidden")
    if not isinstance(hidden, int) or hidden < 1:
        raise ValueError(f"{where}: meta 'hidden' must be a positive integer, got {hidden!r}")
    cost_net, policy = CostNet(hidden), PolicyNet(hidden)
    try:
        cost_net.load_state_dict(payload["cost_net"])
        policy.load_state_dict(payload["policy"])
    except (RuntimeError, KeyError, TypeError) as exc:
        raise ValueError(f"{where}: weights do not fit the networks: {exc}") from None
    for name, module in (("cost_net", cost_net), ("policy", policy)):
        if not all(torch.isfinite(p).all() for p in module.parameters()):
            raise ValueError(f"{where}: {name} holds non-finite weights")
    return DreamShard(cost_net, policy, meta)
