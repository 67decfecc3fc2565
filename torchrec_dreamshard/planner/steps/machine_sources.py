"""Where the planner's models of this machine come from: what the profile step measures
them from (:func:`machine_sources`: the collectives, the dense kernel, the sharding path and
the reference kernel, each cached per machine) and what the type choice reads of them
(:func:`machine_models`: the plan's profile, or what the user gave)."""

from __future__ import annotations

from collections.abc import Callable

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
    """The type choice's models of this machine, read (never measured) from the plan's
    machine profile (``profile()``, built before TorchRec's loop), except the collectives
    and dense kernel the user gave, which replace the profile's."""

    def current() -> MachineProfile | None:
        return profile()

    def profile_collectives() -> CollectiveModels | None:
        found = current()
        return found.collectives if found is not None else None

    def profile_dense() -> DenseKernelModel | None:
        found = current()
        return found.dense_kernel if found is not None else None

    def profile_reference() -> tuple[float, float] | None:
        found = current()
        return found.reference_ms if found is not None else None

    def profile_path() -> ShardingPathModel | None:
        found = current()
        return found.sharding_path if found is not None else None

    return MachineModels(
        profile_collectives if collectives is None else lambda: collectives,
        profile_dense if dense_kernel is None else lambda: dense_kernel,
        profile_reference,
        profile_path,
    )


def machine_sources(topology: Topology) -> MachineSources:
    """Where the profile step measures this machine's models from: the collectives
    (:func:`default_collectives`), the dense kernel (:func:`default_dense_kernel`), the
    sharding path (:func:`default_sharding_path`) and the reference kernel
    (:func:`default_reference`), each cached per machine."""
    return MachineSources(
        reference=default_reference(topology),
        collectives=default_collectives(topology),
        collectives_source=collectives_source(topology),
        dense_kernel=default_dense_kernel(topology),
        sharding_path=default_sharding_path(topology),
        cached=lambda: cached_timings(topology),
    )


def cached_timings(topology: Topology) -> frozenset[str]:
    """The type-choice timings this machine has cached for ``topology`` (or that take no
    timing here), by name: what the profile step need not leave time for."""
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
    """Where :func:`default_collectives` takes the collective models from, in words."""
    group = active_group()
    if group is not None and group.world == topology.world_size:
        return "measured on the job's process group"
    if topology.compute_device != "cpu":
        return "analytic, from the topology's bandwidths (not measured)"
    return "gloo, fitted on ranks that are threads of this process (cached per machine)"


def default_collectives(topology: Topology) -> Callable[[], CollectiveModels]:
    """Where the type choice's collective models come from:

    * while rank 0 of a job drives measurements on the job's group (``collective_plan``)
      of the topology's size: timed on that group, every rank taking part, on its real
      backend and hosts (a second or two, then cached per machine and topology:
      :func:`~torchrec_dreamshard.cost.collective_models.load_group_collectives`);
    * else, on accelerators: analytic models from the topology's intra-host bandwidth
      (unmeasured);
    * else, on CPU ranks outside a distributed job: the gloo models fitted on ranks that
      are threads of this process, so that no process is started (once, about a second,
      then cached: :func:`~torchrec_dreamshard.cost.collective_models.load_collective_models`);
    * else (``plan()`` on one rank of a running job): that cached fit where there is
      one, the analytic models where not, since nothing but the job's group measures
      inside a job.
    """

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


def default_dense_kernel(topology: Topology) -> Callable[[], DenseKernelModel | None]:
    """Where the type choice's model of the data-parallel (dense) kernel comes from: on CPU
    ranks, FBGEMM's dense kernel timed on this machine (once, a few seconds, then cached:
    :func:`~torchrec_dreamshard.cost.dense_kernel_model.load_dense_kernel_model`); on GPUs,
    timed on this machine's GPU where there is one (unmeasured here); else ``None``
    (analytic: the fused kernel plus dense passes at memory bandwidth)."""
    import torch

    if topology.compute_device == "cpu":
        return lambda: load_dense_kernel_model(device="cpu")
    if topology.compute_device == "cuda" and torch.cuda.is_available():
        return lambda: load_dense_kernel_model(device="cuda")
    return lambda: None


def default_reference(topology: Topology) -> Callable[[], tuple[float, float] | None]:
    """Where the type choice's reference-kernel time comes from: measured on this machine's
    CPU (once, a second or two, then cached:
    :func:`~torchrec_dreamshard.cache.reference_time.load_reference_ms`) when planning
    for CPU ranks, on its GPU for GPU ranks where there is one (unmeasured here); else
    ``None`` (the cost network's kernels as predicted)."""
    import torch

    if topology.compute_device == "cpu":
        return lambda: load_reference_ms(device="cpu")
    if topology.compute_device == "cuda" and torch.cuda.is_available():
        return lambda: load_reference_ms(device="cuda")
    return lambda: None


def default_sharding_path(
    topology: Topology,
) -> Callable[[bool], ShardingPathModel | None]:
    """Where the type choice's cost of a sharding path comes from, as
    ``load(may_measure)``: where it is cached, from there; else, where ``may_measure``:

    * while rank 0 of a job drives measurements on the job's group (``collective_plan``)
      of the topology's size: timed on that group, every rank taking part, on its real
      backend and devices (cached per machine and topology:
      :func:`~torchrec_dreamshard.cost.sharding_path_model.load_group_sharding_path`);
    * else, on CPU ranks outside a distributed job: timed on 2 gloo ranks this machine
      starts (once, about 6 s, then cached:
      :func:`~torchrec_dreamshard.cost.sharding_path_model.load_sharding_path_model`);
    * else ``None`` (one rank of a running job alone, or GPUs outside a job): no path cost
      is charged.
    """

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
