"""The hardware a measurement ran on."""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

from torchrec_dreamshard.measure.config import MeasureConfig, stable_key


def cpu_name() -> str:
    """The CPU model (from /proc/cpuinfo where there is one)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: str | torch.device = "cpu") -> str:
    """The model of ``device`` (GPU 0 for a bare ``"cuda"``); machine caches are named for it."""
    d = torch.device(device)
    if d.type != "cuda":
        return cpu_name()
    return torch.cuda.get_device_name(d if d.index is not None else 0)


def measuring_threads(device: str | torch.device = "cpu") -> int:
    """The intra-op threads the timers run a kernel on ``device`` with: 1 on CPU (one thread
    per device, whatever the caller's ``torch.get_num_threads()``), 0 on CUDA."""
    return 0 if torch.device(device).type == "cuda" else 1


def fbgemm_version() -> str:
    """The installed FBGEMM's version (``"unknown"`` where it has none)."""
    import fbgemm_gpu

    return str(getattr(fbgemm_gpu, "__version__", "unknown"))


def hardware_fingerprint(config: MeasureConfig, backend: str = "local") -> dict[str, Any]:
    """Device name, torch and FBGEMM versions, threads per device, backend and timing
    protocol: cost rows are comparable only where their fingerprints are equal."""
    device_name = torch.cuda.get_device_name() if config.device == "cuda" else cpu_name()
    return {
        "device": config.device,
        "device_name": device_name,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "fbgemm_gpu": fbgemm_version(),
        "threads_per_device": measuring_threads(config.device),
        "backend": backend,
        "protocol": timing_protocol(config, backend),
    }


def timing_protocol(config: MeasureConfig, backend: str) -> dict[str, Any]:
    """The parts of the timing protocol that change what a figure means."""
    out = {k: v for k, v in config.protocol().items() if k != "seed"}
    if backend == "distributed":
        out["compute_in_turn"] = config.in_turn
    return out


def fingerprint_key(fingerprint: dict[str, Any]) -> str:
    """A short hash naming a fingerprint."""
    return stable_key(fingerprint)
