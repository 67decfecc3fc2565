"""Every private name of torch the package reads, checked at import: thread ranks' loopback
gloo group and the flat reduce-scatter and all-gather TorchRec's collectives use."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

LOOPBACK = "127.0.0.1"


def _checks() -> list[tuple[str, bool]]:
    """Each private name this module reads and whether the installed torch has it."""
    gloo = getattr(dist, "ProcessGroupGloo", None)
    options_type = getattr(gloo, "_Options", None)
    options = options_type() if options_type is not None else None
    return [
        ("torch.distributed.ProcessGroupGloo (gloo built in)", gloo is not None),
        ("ProcessGroupGloo._Options", options_type is not None),
        ("ProcessGroupGloo._Options()._devices", hasattr(options, "_devices")),
        ("ProcessGroupGloo._Options()._timeout", hasattr(options, "_timeout")),
        ("ProcessGroupGloo.create_device", hasattr(gloo, "create_device")),
        ("ProcessGroupGloo._reduce_scatter_base", hasattr(gloo, "_reduce_scatter_base")),
        ("ProcessGroupGloo._allgather_base", hasattr(gloo, "_allgather_base")),
    ]


def _missing() -> list[str]:
    """Every private name this module reads that the installed torch lacks."""
    return [what for what, ok in _checks() if not ok]


def check_torch() -> None:
    """Raise an ``ImportError`` naming every private name the installed torch lacks."""
    missing = _missing()
    if missing:
        raise ImportError(
            f"torchrec_dreamshard cannot time collectives with torch {torch.__version__}: "
            f"it lacks {'; '.join(missing)}. Install torch>=2.13,<2.15 (the releases "
            "TorchRec 1.8 and 1.9 are built for), or adapt torchrec_dreamshard/ranks/"
            "torch_compat.py to this release."
        )


check_torch()


def loopback_gloo_group(store: Any, rank: int, world: int, timeout: timedelta) -> Any:
    """Rank ``rank`` of a gloo group over ``store`` on the loopback device (unregistered with
    ``torch.distributed``)."""
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=LOOPBACK)]
    options._timeout = timeout
    return dist.ProcessGroupGloo(store, rank, world, options)


def flat_reduce_scatter(group: Any, out: torch.Tensor, inp: torch.Tensor) -> Any:
    """The gloo backend's flat reduce-scatter of ``inp`` into ``out``: its work handle."""
    return group._reduce_scatter_base(out, inp)


def flat_all_gather(group: Any, out: torch.Tensor, inp: torch.Tensor) -> Any:
    """The gloo backend's flat all-gather of ``inp`` into ``out``: its work handle."""
    return group._allgather_base(out, inp)
