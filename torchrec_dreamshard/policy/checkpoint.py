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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from torchrec_dreamshard.cost.cost_net import CostNet
from torchrec_dreamshard.data import tables as _tables
from torchrec_dreamshard.io import atomic_path
from torchrec_dreamshard.policy import CandidateSource, DreamShard, PolicyNet

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
    meta["members"] = agent.cost_net.members
    meta["policy_hidden"] = agent.policy.hidden
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


MAX_HIDDEN = 4096  # widest network a checkpoint may ask for
MAX_MEMBERS = 64  # largest ensemble a checkpoint may ask for
_META_TYPES: dict[str, type | tuple[type, ...]] = {
    "version": str,
    "hardware": dict,
    "workload": dict,
    "workload_key": str,
    "trained": bool,
}


def check_meta(meta: dict[str, Any], where: str) -> None:
    """Validate the metadata a network is built from, before building it.

    ``hidden`` and ``policy_hidden`` (the widths) must be integers in 1..MAX_HIDDEN,
    ``members`` (the ensemble size) in 1..MAX_MEMBERS and ``batch_size`` (informational)
    in 1..MAX_BATCH_SIZE; the informational fields must have their types when present.

    Raises:
        ValueError: naming the file and the field.
    """
    from torchrec_dreamshard.data.tasks import MAX_BATCH_SIZE

    for key, high, required in (
        ("hidden", MAX_HIDDEN, True),
        ("members", MAX_MEMBERS, True),
        ("policy_hidden", MAX_HIDDEN, True),
        ("batch_size", MAX_BATCH_SIZE, False),
    ):
        value = meta.get(key)
        if value is None and not required:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            got = _tables._short(value)
            raise ValueError(f"{where}: meta {key!r} must be an integer in 1..{high}, got {got}")
    for key, kind in _META_TYPES.items():
        if key in meta and not isinstance(meta[key], kind):
            raise ValueError(
                f"{where}: meta {key!r} must be a {getattr(kind, '__name__', kind)}, got "
                f"{_tables._short(meta[key])}"
            )


def check_shapes(state: dict[str, Any], build: Callable[[], torch.nn.Module], where: str) -> None:
    """Compare a state dict's tensors with the network's (built on the meta device, so no
    memory is allocated) before the real network is built.

    Raises:
        ValueError: a missing or unexpected key, a value that is not a floating tensor, or
            a shape that differs (the first one is named).
    """
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in build().state_dict().items()}
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
    """Load an agent (``None``: the checkpoint bundled with the package).

    Args:
        path: the checkpoint file.
        sources: the agent's candidate sources (see ``DreamShard``); a checkpoint holds
            none. The planner side's defaults (TorchRec's plan) are
            :func:`torchrec_dreamshard.planner.candidates.default_sources`.

    Raises:
        ValueError: the file is missing, corrupt, truncated, of another format or feature
            normalisation, or its weights do not fit the networks.
    """
    payload = read_payload(path)
    where = f"checkpoint {str(path if path is not None else BUNDLED_CHECKPOINT)!r}"
    meta = payload["meta"]
    check_meta(meta, where)
    hidden, members, policy_hidden = meta["hidden"], meta["members"], meta["policy_hidden"]

    def build_cost_net() -> CostNet:
        return CostNet(hidden, members)

    def build_policy() -> PolicyNet:
        return PolicyNet(CostNet.state_width(hidden, members), policy_hidden)

    for name, build in (("cost_net", build_cost_net), ("policy", build_policy)):
        check_shapes(payload[name], build, f"{where}: {name}")
    cost_net, policy = build_cost_net(), build_policy()
    try:
        cost_net.load_state_dict(payload["cost_net"])
        policy.load_state_dict(payload["policy"])
    except (RuntimeError, KeyError, TypeError) as exc:
        raise ValueError(f"{where}: weights do not fit the networks: {exc}") from None
    for name, module in (("cost_net", cost_net), ("policy", policy)):
        if not all(torch.isfinite(p).all() for p in module.parameters()):
            raise ValueError(f"{where}: {name} holds non-finite weights")
    return DreamShard(cost_net, policy, meta, sources=sources)
