"""Where the planner's models of this machine come from: what the profile step measures
(:func:`machine_sources`, each cached per machine) and what the type choice reads
(:func:`machine_models`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchrec.distributed.planner.types import Topology

from torchrec_dreamshard.cache.reference_time import load_reference_ms
from torchrec_dreamshard.cost.collective_models import (
    CollectiveModels,
    default_collectives_path,
    group_collectives_file,
    load_collective_models,
    load_group_collectives,
)
from torchrec_dreamshard.cost.comm_topology import CommTopology, analytic_models
from torchrec_dreamshard.cost.dense_kernel_model import (
    DenseKernelModel,
    default_dense_kernel_path,
    load_dense_kernel_model,
)
from torchrec_dreamshard.cost.sharding_path_model import (
    ShardingPathModel,
    default_sharding_path_path,
    group_sharding_path_file,
    load_group_sharding_path,
    load_sharding_path_model,
)
from torchrec_dreamshard.planner.stages.proposers import MachineModels
from torchrec_dreamshard.planner.steps.profile_step import MachineSources
from torchrec_dreamshard.profile.machine_profile import MachineProfile
from torchrec_dreamshard.ranks.job_group import active_group
from torchrec_dreamshard.ranks.spawn import skip_measuring


def machine_models(
    profile: Callable[[], MachineProfile | None],
    collectives: CollectiveModels | None,
    dense_kernel: DenseKernelModel | None,
) -> MachineModels:
    """The type choice's models, read (never measured) from the plan's machine profile,
    except the collectives and dense kernel the user gave."""

    def read(field: str) -> Callable[[], Any]:
        def value() -> Any:
            found = profile()
            return getattr(found, field) if found is not None else None

        return value

    return MachineModels(
        read("collectives") if collectives is None else lambda: collectives,
        read("dense_kernel") if dense_kernel is None else lambda: dense_kernel,
        read("reference_ms"),
        read("sharding_path"),
    )


def machine_sources(topology: Topology) -> MachineSources:
    """Where the profile step measures this machine's models from."""
    return MachineSources(
        reference=measured_here(topology, load_reference_ms),
        collectives=default_collectives(topology),
        collectives_source=collectives_source(topology),
        dense_kernel=measured_here(topology, load_dense_kernel_model),
        sharding_path=default_sharding_path(topology),
        cached=lambda: cached_timings(topology),
    )


def cached_timings(topology: Topology) -> frozenset[str]:
    """The type-choice timings cached for ``topology`` (or taking none here), by name."""
    group = active_group()
    device = topology.compute_device
    if group is not None and group.world == topology.world_size:
        files = {
            "collectives": group_collectives_file(group.backend, group.hosts).path,
            "sharding path": group_sharding_path_file(group).path,
        }
    elif device == "cpu":
        files = {
            "collectives": default_collectives_path("gloo"),
            "sharding path": default_sharding_path_path("cpu"),
        }
    else:  # analytic collectives, no path timed outside a job
        files = {}
    found = {name for name, path in files.items() if path.exists()}
    if device != "cpu" and group is None:
        found |= {"collectives", "sharding path"}
    if device in ("cpu", "cuda") and default_dense_kernel_path(device).exists():
        found.add("dense kernel")
    return frozenset(found)


def collectives_source(topology: Topology) -> str:
    """Where :func:`default_collectives` takes its models from, in words."""
    group = active_group()
    if group is not None and group.world == topology.world_size:
        return "measured on the job's process group"
    if topology.compute_device != "cpu":
        return "analytic, from the topology's bandwidths (not measured)"
    return "gloo, fitted on ranks that are threads of this process (cached per machine)"


def default_collectives(topology: Topology) -> Callable[[], CollectiveModels]:
    """The type choice's collective models: timed on the job's group where rank 0 drives
    measurements on one of the topology's size; analytic on accelerators; else gloo fitted
    on thread ranks (on one rank of a running job, only where cached)."""

    def load() -> CollectiveModels:
        group = active_group()
        if group is not None and group.world == topology.world_size:
            return load_group_collectives(group)
        analytic = analytic_models(CommTopology.from_torchrec(topology))
        if topology.compute_device != "cpu":
            return analytic
        if skip_measuring(default_collectives_path("gloo"), "pricing collectives analytically"):
            return analytic
        return load_collective_models(backend="gloo")

    return load


def measured_here(topology: Topology, load: Callable[..., Any]) -> Callable[[], Any]:
    """``load`` (the dense-kernel model or the reference time) on the topology's device
    where this machine has one, timed once then cached; else ``None`` (analytic)."""
    import torch

    if topology.compute_device == "cpu":
        return lambda: load(device="cpu")
    if topology.compute_device == "cuda" and torch.cuda.is_available():
        return lambda: load(device="cuda")
    return lambda: None


def default_sharding_path(
    topology: Topology,
) -> Callable[[bool], ShardingPathModel | None]:
    """The type choice's sharding-path cost, as ``load(may_measure)``: cached, else (where
    ``may_measure``) timed on the job's group, or on 2 gloo ranks on CPU outside a job;
    ``None`` elsewhere (no path cost is charged)."""

    def load(may_measure: bool = True) -> ShardingPathModel | None:
        group = active_group()
        if group is not None and group.world == topology.world_size:
            cached = group_sharding_path_file(group).path
            if not may_measure and not cached.exists():
                return None
            return load_group_sharding_path(group)
        if topology.compute_device != "cpu":
            return None
        cached = default_sharding_path_path("cpu")
        if skip_measuring(cached, "charging no sharding-path cost"):
            return None
        if not may_measure and not cached.exists():
            return None
        return load_sharding_path_model(device="cpu")

    return load
