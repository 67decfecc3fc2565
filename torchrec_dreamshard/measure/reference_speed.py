"""This machine's time on the reference kernel, measured once and cached.

A cost network trained on another machine prices fused kernels in that machine's time:
the bundled one was trained on an AMD EPYC, and on an Intel Xeon its prediction of the
reference kernel's backward is 16 times too short. Where the planner sets such prices
beside costs measured here (the dense kernel of data-parallel tables, the collectives),
it brings them to this machine's time by the ratio of the reference kernel
(:data:`~torchrec_dreamshard.measure.embedding_kernels.REFERENCE_TABLES` at batch
:data:`~torchrec_dreamshard.measure.embedding_kernels.REFERENCE_BATCH_SIZE`, row-wise Adagrad) as
measured here to the network's prediction of it, forward and backward apart
(:func:`speed_ratio`). One kernel cannot say how every table's time moves between two
machines; calibration (``calibrate=``) measures the user's own tables and is the better
fix where it is affordable.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.embedding_kernels import (
    REFERENCE_BATCH_SIZE,
    REFERENCE_TABLES,
    time_fused_kernel,
)
from torchrec_dreamshard.measure.gate import check_may_measure
from torchrec_dreamshard.measure.group_tasks import run_on_group
from torchrec_dreamshard.measure.hardware import cpu_name
from torchrec_dreamshard.measure.machine_cache import (
    CacheFile,
    load_cached,
    loaded_memo,
    machine_cache_file,
    named_file,
)
from torchrec_dreamshard.measure.spent import spent_on
from torchrec_dreamshard.ranks.job_group import (
    JobGroup,
    active_group,
    group_task,
)

FORMAT_VERSION = 1


@spent_on("reference_kernel")
def measure_reference_ms(device: str = "cpu") -> tuple[float, float]:
    """``(fwd_ms, bwd_ms)`` of the reference kernel on this machine (a second or two);
    while rank 0 of a job drives measurements on its group, the median over its ranks,
    each timing it on its own device."""
    check_may_measure("measure_reference_ms")
    if active_group() is not None:
        times = run_on_group(_group_reference_ms)
        return statistics.median(f for f, _ in times), statistics.median(b for _, b in times)
    return _time_reference(device)


def _time_reference(device: str) -> tuple[float, float]:
    config = MeasureConfig(device=device, rounds=3, iters=5)
    return time_fused_kernel(list(REFERENCE_TABLES), REFERENCE_BATCH_SIZE, config)


@group_task
def _group_reference_ms(group: JobGroup) -> tuple[float, float]:
    return _time_reference("cuda" if group.device.type == "cuda" else "cpu")


def reference_cache_file(device: str = "cpu") -> CacheFile:
    """This machine's cache file of the reference kernel on ``device``, keyed by
    :func:`~torchrec_dreamshard.measure.machine_cache.measurement_key` and the file's
    format."""
    return machine_cache_file("reference_kernel", device, device, format=FORMAT_VERSION)


def default_reference_path(device: str = "cpu") -> Path:
    """Where :func:`reference_cache_file` is."""
    return reference_cache_file(device).path


_LOADED: dict[str, tuple[float, float]] = loaded_memo()


def _parse(data: Any) -> tuple[float, float]:
    try:
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"format version {data.get('version')!r}")
        ms = (float(data["fwd_ms"]), float(data["bwd_ms"]))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed ({exc})") from None
    if not (ms[0] > 0 and ms[1] > 0):
        raise ValueError(f"malformed (times {ms} are not positive)")
    return ms


def load_reference_ms(
    path: str | os.PathLike | None = None, device: str = "cpu"
) -> tuple[float, float]:
    """The reference kernel's ``(fwd_ms, bwd_ms)`` here, from ``path`` (default
    :func:`default_reference_path`), measured and saved first when it does not exist."""
    file = named_file(path) if path is not None else reference_cache_file(device)

    def dump(ms: tuple[float, float]) -> dict[str, Any]:
        where = cpu_name() if device == "cpu" else device
        return {"version": FORMAT_VERSION, "fwd_ms": ms[0], "bwd_ms": ms[1], "source": where}

    measure = lambda: measure_reference_ms(device)  # noqa: E731 - late-bound for tests
    return load_cached(file, "reference kernel file", _parse, measure, dump, _LOADED)


def speed_ratio(
    measured: tuple[float, float], predicted: tuple[float, float]
) -> tuple[float, float]:
    """``(fwd, bwd)`` factors that bring a prediction to this machine's time: measured
    over predicted (1 where the prediction is not positive)."""
    return tuple(m / p if p > 0 else 1.0 for m, p in zip(measured, predicted, strict=True))
