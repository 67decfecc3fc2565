"""Saving and loading a :class:`~torchrec_dreamshard.policy.DreamShard` agent: a
``torch.save`` file of the two state dicts, plain ``meta`` and ``extra``, loaded with
``weights_only=True`` (every problem a ``ValueError`` naming the file).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from torchrec_dreamshard.cost.cost_net import CostNet
from torchrec_dreamshard.data import tables as _tables
from torchrec_dreamshard.io import atomic_path
from torchrec_dreamshard.policy import CandidateSource, DreamShard
from torchrec_dreamshard.policy.policy_net import POLICY_KEY, build_networks, policy_class
from torchrec_dreamshard.version import __version__

BUNDLED_CHECKPOINT = Path(__file__).resolve().parent.parent / "checkpoints" / "cpu_default.pt"
FORMAT = "torchrec-dreamshard"
FORMAT_VERSION = 2  # 2: the physical ensemble cost network (1: the first cost network)


def feature_spec() -> dict[str, Any]:
    """The feature normalisation this package computes (a checkpoint must match it)."""
    from torchrec_dreamshard.cost import physics

    return {
        "names": list(_tables.FEATURE_NAMES),
        "dim": _tables.FEATURE_DIM,
        "scales": dict(_tables.FEATURE_SCALES),
        "quantities": list(physics.QUANTITY_NAMES),
        "quantity_scales": [float(x) for x in physics.SCALES],
    }


def plain(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as plain JSON types, all ``weights_only`` loading accepts besides tensors."""
    return json.loads(json.dumps(data, default=str))


def save_checkpoint(agent: DreamShard, path: str | Path, extra: dict | None = None) -> None:
    """Write ``agent`` to ``path`` atomically.

    Args:
        extra: plain values to keep alongside (e.g. the training state to resume).
    """
    meta = dict(agent.meta)
    meta.setdefault("version", __version__)
    meta["features"] = feature_spec()
    meta.update(agent.cost_net.config())
    meta.update(agent.policy.config())
    meta[POLICY_KEY] = agent.policy.architecture
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
    with atomic_path(path, "checkpoint") as tmp:  # fsynced, then renamed
        torch.save(payload, tmp)


def read_payload(path: str | Path | None = None) -> dict[str, Any]:
    """The checked contents of a checkpoint file (``None``: the bundled one)."""
    path = Path(path) if path is not None else BUNDLED_CHECKPOINT
    where = f"checkpoint {str(path)!r}"
    if path.is_dir():
        raise ValueError(f"{where} is a directory, not a checkpoint file")
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


_META_TYPES: dict[str, type | tuple[type, ...]] = {
    "version": str,
    "hardware": dict,
    "workload": dict,
    "workload_key": str,
    "trained": bool,
    POLICY_KEY: str,
}


def check_meta(meta: dict[str, Any], where: str) -> None:
    """Validate the metadata the networks are built from (a ``ValueError`` naming the file
    and the field)."""
    from torchrec_dreamshard.data.tasks import MAX_BATCH_SIZE

    for key, kind in _META_TYPES.items():
        if key in meta and not isinstance(meta[key], kind):
            raise ValueError(
                f"{where}: meta {key!r} must be a {getattr(kind, '__name__', kind)}, got "
                f"{_tables.short_repr(meta[key])}"
            )
    try:
        policy = policy_class(meta)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    limits = {**CostNet.CONFIG_LIMITS, **policy.CONFIG_LIMITS}
    checks = [(key, high, True) for key, high in limits.items()]
    for key, high, required in [*checks, ("batch_size", MAX_BATCH_SIZE, False)]:
        value = meta.get(key)
        if value is None and not required:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            got = _tables.short_repr(value)
            raise ValueError(f"{where}: meta {key!r} must be an integer in 1..{high}, got {got}")


def check_shapes(state: dict[str, Any], network: torch.nn.Module, where: str) -> None:
    """Check a state dict's keys, dtypes and shapes against ``network``'s (a ``ValueError``)."""
    expected = {k: tuple(v.shape) for k, v in network.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{where}: weights do not fit the networks: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    for key, shape in expected.items():
        value = state[key]
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise ValueError(f"{where}: {key!r} is not a floating-point tensor")
        if tuple(value.shape) != shape:
            raise ValueError(
                f"{where}: weights do not fit the networks: {key!r} has shape "
                f"{tuple(value.shape)}, the network the metadata describes needs {shape}"
            )


def load_checkpoint(
    path: str | Path | None = None, sources: Sequence[CandidateSource] = ()
) -> DreamShard:
    """Load an agent (``path`` ``None``: the checkpoint bundled with the package).

    Args:
        sources: the agent's candidate sources (a checkpoint holds none).

    Raises:
        ValueError: the file is missing, corrupt, of another format or feature
            normalisation, or its weights do not fit the networks.
    """
    payload = read_payload(path)
    where = f"checkpoint {str(path if path is not None else BUNDLED_CHECKPOINT)!r}"
    meta = payload["meta"]
    check_meta(meta, where)
    with torch.device("meta"):
        shapes = build_networks(meta)
    for name, network in zip(("cost_net", "policy"), shapes, strict=True):
        check_shapes(payload[name], network, f"{where}: {name}")
    cost_net, policy = build_networks(meta)
    try:
        cost_net.load_state_dict(payload["cost_net"])
        policy.load_state_dict(payload["policy"])
    except (RuntimeError, KeyError, TypeError) as exc:
        raise ValueError(f"{where}: weights do not fit the networks: {exc}") from None
    for name, module in (("cost_net", cost_net), ("policy", policy)):
        if not all(torch.isfinite(p).all() for p in module.parameters()):
            raise ValueError(f"{where}: {name} holds non-finite weights")
    return DreamShard(cost_net, policy, meta, sources=sources)
