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


def hardware_fingerprint(config: MeasureConfig) -> dict[str, Any]:
    """Device name, torch and FBGEMM versions and threads per device.

    Rows of the cost dataset are only comparable when their fingerprints are equal.
    """
    from torchrec_dreamshard.measure.kernels import fbgemm_version

    if config.device == "cuda":
        device_name = torch.cuda.get_device_name()
        threads = 0
    else:
        device_name = cpu_name()
        threads = 1  # one thread stands for one device
    return {
        "device": config.device,
        "device_name": device_name,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "fbgemm_gpu": fbgemm_version(),
        "threads_per_device": threads,
    }


def fingerprint_key(fingerprint: dict[str, Any]) -> str:
    """A short hash naming a fingerprint."""
    return stable_key(fingerprint)
