"""This machine's time on the reference kernel, measured once and cached.

A cost network trained on another machine prices fused kernels in that machine's time:
the bundled one was trained on an AMD EPYC, and on an Intel Xeon its prediction of the
reference kernel's backward is 16 times too short. Where the planner sets such prices
beside costs measured here (the dense kernel of data-parallel tables, the collectives),
it brings them to this machine's time by the ratio of the reference kernel
(:data:`~torchrec_dreamshard.measure.kernels.REFERENCE_TABLES` at batch
:data:`~torchrec_dreamshard.measure.kernels.REFERENCE_BATCH_SIZE`, row-wise Adagrad) as
measured here to the network's prediction of it, forward and backward apart
(:func:`speed_ratio`). One kernel cannot say how every table's time moves between two
machines; calibration (``calibrate=``) measures the user's own tables and is the better
fix where it is affordable.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch

from torchrec_dreamshard.io import atomic_write, dumps_strict, read_json
from torchrec_dreamshard.measure.config import MeasureConfig, stable_key
from torchrec_dreamshard.measure.hardware import cpu_name
from torchrec_dreamshard.measure.kernels import (
    REFERENCE_BATCH_SIZE,
    REFERENCE_TABLES,
    time_fused_kernel,
)

FORMAT_VERSION = 1


def measure_reference_ms(device: str = "cpu") -> tuple[float, float]:
    """``(fwd_ms, bwd_ms)`` of the reference kernel on this machine (a second or two)."""
    config = MeasureConfig(device=device, rounds=3, iters=5)
    return time_fused_kernel(list(REFERENCE_TABLES), REFERENCE_BATCH_SIZE, config)


def default_reference_path(device: str = "cpu") -> Path:
    """Per-machine cache file (beside the collectives' and the dense kernel's models)."""
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    name = torch.cuda.get_device_name(0) if device == "cuda" else cpu_name()
    machine = stable_key([socket.gethostname(), name, torch.__version__])
    return base / "torchrec_dreamshard" / f"reference_kernel_{device}_{machine}.json"


_LOADED: dict[str, tuple[float, float]] = {}


def load_reference_ms(
    path: str | os.PathLike | None = None, device: str = "cpu"
) -> tuple[float, float]:
    """The reference kernel's ``(fwd_ms, bwd_ms)`` here, from ``path`` (default
    :func:`default_reference_path`), measured and saved first when it does not exist."""
    path = Path(path) if path is not None else default_reference_path(device)
    if str(path) in _LOADED:
        return _LOADED[str(path)]
    if path.exists():
        data = read_json(path, "reference kernel file")
        try:
            if data.get("version") != FORMAT_VERSION:
                raise ValueError(f"format version {data.get('version')!r}")
            ms = (float(data["fwd_ms"]), float(data["bwd_ms"]))
            if not (ms[0] > 0 and ms[1] > 0):
                raise ValueError(f"times {ms} are not positive")
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"reference kernel file {str(path)!r} is malformed ({exc}); delete it to "
                "measure again"
            ) from None
    else:
        ms = measure_reference_ms(device)
        record = {"version": FORMAT_VERSION, "fwd_ms": ms[0], "bwd_ms": ms[1]}
        record["source"] = f"reference kernel on {cpu_name() if device == 'cpu' else device}"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, dumps_strict(record), "reference kernel file")
    _LOADED[str(path)] = ms
    return ms


def speed_ratio(
    measured: tuple[float, float], predicted: tuple[float, float]
) -> tuple[float, float]:
    """``(fwd, bwd)`` factors that bring a prediction to this machine's time: measured
    over predicted (1 where the prediction is not positive)."""
    return tuple(m / p if p > 0 else 1.0 for m, p in zip(measured, predicted, strict=True))
