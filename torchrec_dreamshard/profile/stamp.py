"""What a measurement was taken on (:class:`MachineStamp`); it travels with a profile."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from torchrec_dreamshard.measure.hardware import device_name, fbgemm_version


@dataclass(frozen=True)
class MachineStamp:
    """The hardware and software a profile was measured on.

    Attributes:
        device_name: the CPU or GPU model.
        threads: torch's intra-op threads where it was measured.
        world_size: the devices the profile's collectives were fitted for.
    """

    device: str
    device_name: str
    threads: int
    torch: str
    fbgemm: str
    world_size: int
    local_world_size: int

    @classmethod
    def here(cls, device: str, world_size: int, local_world_size: int) -> MachineStamp:
        """This process's stamp for ``world_size`` ``device`` ranks (a CUDA stamp's GPU model
        is ``"unmeasured"`` without CUDA)."""
        if device == "cuda" and not torch.cuda.is_available():
            name = "unmeasured"
        else:
            name = device_name(device)
        return cls(
            device=device,
            device_name=name,
            threads=torch.get_num_threads(),
            torch=str(torch.__version__),
            fbgemm=_fbgemm_version(),
            world_size=int(world_size),
            local_world_size=int(local_world_size),
        )

    def differences(self, other: MachineStamp, fields: tuple[str, ...] | None = None) -> list[str]:
        """``"field: ours -> theirs"`` for each of ``fields`` (default all) that differs."""
        mine, theirs = asdict(self), asdict(other)
        names = fields if fields is not None else tuple(mine)
        return [f"{k}: {mine[k]!r} -> {theirs[k]!r}" for k in names if mine[k] != theirs[k]]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> MachineStamp:
        if not isinstance(data, dict):
            raise ValueError(f"a machine stamp must be an object, got {type(data).__name__}")
        fields = cls.__dataclass_fields__
        missing = sorted(set(fields) - set(data))
        if missing:
            raise ValueError(f"the machine stamp lacks {missing}")
        return cls(**{k: data[k] for k in fields})


def _fbgemm_version() -> str:
    try:
        return fbgemm_version()
    except ImportError:
        return "missing"


# what makes a profile another machine's; the settings only say what it was measured for
HARDWARE_FIELDS = ("device", "device_name", "torch", "fbgemm")
SETTING_FIELDS = ("threads", "world_size", "local_world_size")
