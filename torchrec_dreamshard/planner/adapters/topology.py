"""The TorchRec ``Topology`` a model is planned on, built the way TorchRec asks
(:func:`torchrec_topology`). Public TorchRec API only."""

from __future__ import annotations

from collections.abc import Sequence

from torchrec.distributed.planner.types import (
    CustomTopologyData,
    KernelConfig,
    Topology,
    TopologyFactory,
    TrainerConfig,
)


def torchrec_topology(
    world_size: int,
    compute_device: str,
    *,
    local_world_size: int | None = None,
    hbm_cap: int | None = None,
    ddr_cap: int | None = None,
    hbm_caps: Sequence[int] | None = None,
    ddr_caps: Sequence[int] | None = None,
) -> Topology:
    """A TorchRec ``Topology`` through ``TopologyFactory.create_topology``, as
    ``Topology(...)`` builds it (constructed directly, it logs that "the job will fail").

    Args:
        world_size: ranks.
        compute_device: ``"cpu"``, ``"cuda"`` or ``"mtia"``.
        local_world_size: ranks per host (``None``: all of them).
        hbm_cap: HBM bytes of each device (ignored on ``"cpu"``; ``None``: TorchRec's).
        ddr_cap: DDR bytes of each device (``None``: TorchRec's).
        hbm_caps, ddr_caps: bytes of each device, one per rank; over ``hbm_cap`` / ``ddr_cap``.

    Raises:
        ValueError: ``hbm_caps`` or ``ddr_caps`` is not one positive whole number per rank.
    """
    per_device = {}
    for key, caps in (("hbm_cap", hbm_caps), ("ddr_cap", ddr_caps)):
        if caps is None:
            continue
        caps = list(caps)
        if len(caps) != world_size or not all(isinstance(c, int) and c > 0 for c in caps):
            raise ValueError(
                f"{key}s must be {world_size} positive whole numbers of bytes (one per rank), "
                f"got {caps[:8]}{' ...' if len(caps) > 8 else ''}"
            )
        per_device[key] = caps
    extra = (
        {"custom_topology_data": CustomTopologyData(per_device, world_size)} if per_device else {}
    )
    return TopologyFactory.create_topology(
        trainer_config=TrainerConfig(
            world_size=world_size,
            local_world_size=local_world_size,
            hbm_cap_bytes=hbm_cap,
            ddr_cap_bytes=ddr_cap,
            additional_params=extra,
        ),
        kernel_config=KernelConfig(compute_device=compute_device),
    )
