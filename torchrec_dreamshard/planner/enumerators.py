"""``DreamShardEnumerator`` and ``CostNetShardEstimator``: the search space DreamShard plans.

Every table the policy can place (an ``EmbeddingBagCollection`` table whose constraints
allow table-wise sharding on the fused kernel, and whose table-wise storage fits at least
one device after TorchRec's storage reservation, or which may be split column-wise small
enough to fit) gets exactly one option: table-wise, fused. Every other table gets the
options TorchRec's own ``EmbeddingEnumerator`` would give it (without table-wise when it
fits no device), and TorchRec's machinery plans it.

Splits. A DreamShard table whose constraints also allow ``column_wise`` on the fused kernel
may be split (:attr:`DreamShardEnumerator.split_widths`); its shards are at least
``ParameterConstraints.min_partition`` columns wide, TorchRec's ``MIN_CW_DIM`` (128) when
that is unset, as in TorchRec's own column-wise rule. The proposer decides the splits and
asks :meth:`DreamShardEnumerator.column_wise_option` for the column-wise option of each.

Perf of a DreamShard option is the cost network's single-table cost (forward + backward +
communication, the agent's ``table_costs``) on the task's device count and global batch;
storage is TorchRec's ``EmbeddingStorageEstimator``; perf of every other option is
TorchRec's perf estimator.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from torch import nn
from torchrec.distributed.planner.constants import DEFAULT_PERF_ESTIMATOR, MIN_CW_DIM
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.estimator import EmbeddingPerfEstimatorFactory
from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator
from torchrec.distributed.planner.types import (
    ParameterConstraints,
    PartitionByType,
    Perf,
    PlannerError,
    PlannerErrorType,
    Shard,
    SharderDataMap,
    ShardEstimator,
    ShardingOption,
    StorageReservation,
    Topology,
)
from torchrec.distributed.types import ModuleSharder
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from torchrec_dreamshard.planner.types import (
    DREAMSHARD_COMPUTE_KERNEL,
    DREAMSHARD_SHARDING_TYPE,
    SPLIT_COLUMNS_ATTR,
    SPLIT_SHARDING_TYPE,
    PlacementAgent,
    device_capacity,
    is_dreamshard_option,
    memory_tier,
    option_bytes,
    prediction_task,
    spec_for_option,
)
from torchrec_dreamshard.splits import column_shards, split_counts
from torchrec_dreamshard.table_stats import group_stats, merge_stats
from torchrec_dreamshard.tables import TableSpec
from torchrec_dreamshard.tasks import Task
from torchrec_dreamshard.torchrec_adapter import reserved_topology

logger: logging.Logger = logging.getLogger(__name__)

SpecFn = Callable[[ShardingOption], TableSpec]


def single_table_costs(agent: PlacementAgent, task: Task) -> np.ndarray:
    """Predicted ms of each table of ``task`` alone on one of its devices, at the task's
    batch (forward + backward + communication, the agent's ``table_costs``)."""
    return np.asarray(agent.table_costs(task), dtype=np.float64)


class CostNetShardEstimator(ShardEstimator):
    """Fills the perf of DreamShard options from the cost network.

    Options DreamShard does not place are rated by TorchRec's default perf estimator.

    Args:
        topology: the devices.
        constraints: TorchRec per-table constraints.
        agent: the DreamShard agent whose cost network rates the tables.
        batch_size: the *global* batch (TorchRec's per-rank batch times the world size).
        spec_fn: turns an option into a :class:`TableSpec` (defaults to
            :func:`spec_for_option`, without reuse statistics).
    """

    def __init__(
        self,
        topology: Topology,
        constraints: dict[str, ParameterConstraints] | None = None,
        agent: PlacementAgent | None = None,
        batch_size: int = 512,
        spec_fn: SpecFn | None = None,
    ) -> None:
        if agent is None:
            raise ValueError("CostNetShardEstimator needs a DreamShard agent (agent=...)")
        self._topology = topology
        self._agent = agent
        self._batch_size = batch_size
        self._spec_fn: SpecFn = spec_fn or spec_for_option
        self._fallback: ShardEstimator = EmbeddingPerfEstimatorFactory.create(
            DEFAULT_PERF_ESTIMATOR, topology=topology, constraints=constraints
        )

    def estimate(
        self, sharding_options: list[ShardingOption], sharder_data_map: SharderDataMap
    ) -> None:
        """Set ``shard.perf`` of every option in place."""
        ours = [o for o in sharding_options if is_dreamshard_option(o)]
        others = [o for o in sharding_options if not is_dreamshard_option(o)]
        if others:
            self._fallback.estimate(others, sharder_data_map=sharder_data_map)
        if not ours:
            return
        specs = _unique_specs([self._spec_fn(o) for o in ours])
        task = prediction_task(specs, self._topology.world_size, self._batch_size)
        costs = single_table_costs(self._agent, task)
        row = {t.name: i for i, t in enumerate(specs)}
        for option in ours:
            cost = float(costs[row[option.fqn]])
            for shard in option.shards:
                # The cost network rates a table as a whole; its per-rank forward,
                # backward and communication split is logged by CostNetStats.
                shard.perf = Perf(fwd_compute=cost, fwd_comms=0.0, bwd_compute=0.0, bwd_comms=0.0)


def _unique_specs(specs: Sequence[TableSpec]) -> list[TableSpec]:
    seen: dict[str, TableSpec] = {}
    for s in specs:
        seen.setdefault(s.name, s)
    return list(seen.values())


class DreamShardEnumerator(EmbeddingEnumerator):
    """TorchRec's enumerator, narrowed to one table-wise fused option per DreamShard table.

    Args:
        topology: the devices.
        batch_size: TorchRec's per-rank batch.
        constraints: TorchRec per-table constraints (pooling factors, allowed sharding
            types and kernels).
        agent: the DreamShard agent (its cost network fills the perf of our options).
        storage_reservation: the planner's storage reservation; a table whose table-wise
            storage fits no device after it is left to TorchRec.
        sample_batches: optional ``KeyedJaggedTensor`` batches (per-rank batches) from
            which each table's reuse histogram is measured; consecutive groups of
            ``world_size`` batches are taken together as the global batch a table-wise
            kernel sees.
        estimator: override the estimators (default: the cost network plus TorchRec's
            storage estimator).
    """

    def __init__(
        self,
        topology: Topology,
        batch_size: int,
        constraints: dict[str, ParameterConstraints] | None = None,
        agent: PlacementAgent | None = None,
        storage_reservation: StorageReservation | None = None,
        sample_batches: Iterable[Any] | None = None,
        estimator: ShardEstimator | list[ShardEstimator] | None = None,
    ) -> None:
        self._topology = topology
        self._reservation = storage_reservation
        self._samples = list(sample_batches) if sample_batches is not None else []
        self.table_specs: dict[str, TableSpec] = {}
        self.fallback_fqns: set[str] = set()
        self.split_widths: dict[str, int] = {}
        self._cw_widths: dict[str, int] = {}
        self._constraints_by_name = constraints or {}
        self._reuse: dict[str, tuple[float, ...]] = {}
        self._too_big: dict[str, tuple[int, int]] = {}
        if estimator is None:
            estimator = [
                CostNetShardEstimator(
                    topology, constraints, agent, batch_size * topology.world_size,
                    spec_fn=self.table_spec,
                ),
                EmbeddingStorageEstimator(topology=topology, constraints=constraints),
            ]  # fmt: skip
        super().__init__(topology, batch_size, constraints, estimator)

    # -- public ---------------------------------------------------------------------------

    def table_spec(self, option: ShardingOption) -> TableSpec:
        """The :class:`TableSpec` of a DreamShard option (with measured reuse, if any)."""
        spec = self.table_specs.get(option.fqn)
        if spec is None:
            spec = spec_for_option(option, self._reuse.get(option.fqn))
            self.table_specs[option.fqn] = spec
        return spec

    def enumerate(
        self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]]
    ) -> list[ShardingOption]:
        """Sharding options for ``module``: one per DreamShard table, TorchRec's for the
        rest (see the module docstring)."""
        self.table_specs = {}
        self._too_big = {}
        self._cw_widths = {}
        self._reuse = _reuse_hists(module, self._samples, self._topology.world_size)
        options = self._enumerate_once(module, sharders)
        self.split_widths = self._split_widths(options)
        too_big = self._too_big_tables(options)
        if too_big:
            self._too_big = too_big
            redo = self._enumerate_once(module, sharders)
            options = [o for o in options if o.name not in too_big] + [
                o for o in redo if o.name in too_big
            ]
        self.fallback_fqns = {o.fqn for o in options if not is_dreamshard_option(o)}
        self.split_widths = {
            k: w for k, w in self.split_widths.items() if k not in self.fallback_fqns
        }
        if self.fallback_fqns:
            logger.info(
                "DreamShard leaves %d table(s) to TorchRec's planner: %s",
                len(self.fallback_fqns),
                sorted(self.fallback_fqns),
            )
        return options

    # -- TorchRec hooks -------------------------------------------------------------------

    def _filter_sharding_types(
        self, name: str, allowed_sharding_types: list[str], sharder_key: str = ""
    ) -> list[str]:
        types = super()._filter_sharding_types(name, allowed_sharding_types, sharder_key)
        if name in self._too_big:
            rest = [t for t in types if t != DREAMSHARD_SHARDING_TYPE]
            if not rest:
                raise PlannerError(
                    self._too_big_message(name), PlannerErrorType.INSUFFICIENT_STORAGE
                )
            return rest
        if self._eligible(name, types, sharder_key):
            if self._eligible(name, types, sharder_key, SPLIT_SHARDING_TYPE):
                min_partition = getattr(self._constraints_by_name.get(name), "min_partition", 0)
                self._cw_widths[name] = int(min_partition or MIN_CW_DIM)
            return [DREAMSHARD_SHARDING_TYPE]
        return types

    def _filter_compute_kernels(
        self, name: str, allowed_compute_kernels: list[str], sharding_type: str
    ) -> list[str]:
        kernels = super()._filter_compute_kernels(name, allowed_compute_kernels, sharding_type)
        if (
            sharding_type == DREAMSHARD_SHARDING_TYPE
            and name not in self._too_big
            and DREAMSHARD_COMPUTE_KERNEL in kernels
        ):
            return [DREAMSHARD_COMPUTE_KERNEL]
        return kernels

    # -- helpers --------------------------------------------------------------------------

    def _enumerate_once(
        self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]]
    ) -> list[ShardingOption]:
        self._last_stored_module = None  # TorchRec's own cache would skip our second pass
        try:
            return super().enumerate(module, sharders)
        finally:
            self._last_stored_module = None
            self._last_stored_search_space = None

    def _eligible(
        self,
        name: str,
        types: list[str],
        sharder_key: str,
        sharding_type: str = DREAMSHARD_SHARDING_TYPE,
    ) -> bool:
        """``sharding_type`` (default table-wise) is allowed on the fused kernel and the
        module is an EmbeddingBagCollection."""
        sharder = self._sharder_map.get(sharder_key)
        if sharder is None or sharding_type not in types:
            return False
        if not issubclass(sharder.module_type, EmbeddingBagCollection):
            return False
        kernels = super()._filter_compute_kernels(
            name, sharder.compute_kernels(sharding_type, self._compute_device), sharding_type
        )
        return DREAMSHARD_COMPUTE_KERNEL in kernels

    def _split_widths(self, options: list[ShardingOption]) -> dict[str, int]:
        """Minimum shard width of every DreamShard table that may be split, by fqn (only
        tables with at least one shard count the column-wise rule allows)."""
        out: dict[str, int] = {}
        world = self._topology.world_size
        for o in options:
            width = self._cw_widths.get(o.name)
            if is_dreamshard_option(o) and width and split_counts(self.table_spec(o), world, width):
                out[o.fqn] = width
        return out

    def column_wise_option(
        self, option: ShardingOption, columns: Sequence[tuple[int, int]]
    ) -> ShardingOption:
        """The column-wise fused option of a DreamShard table cut at ``columns`` (one
        ``(start, end)`` per shard), with TorchRec's storage estimate of each shard; its
        ranks are for the proposer to set."""
        rows = int(option.tensor.shape[0])
        split = ShardingOption(
            name=option.name,
            tensor=option.tensor,
            module=option.module,
            input_lengths=option.input_lengths,
            batch_size=option.batch_size,
            sharding_type=SPLIT_SHARDING_TYPE,
            partition_by=PartitionByType.DEVICE.value,
            compute_kernel=option.compute_kernel,
            shards=[Shard(size=[rows, b - a], offset=[0, a]) for a, b in columns],
            cache_params=option.cache_params,
            enforce_hbm=option.enforce_hbm,
            stochastic_rounding=option.stochastic_rounding,
            bounds_check_mode=option.bounds_check_mode,
            dependency=option.dependency,
            is_pooled=option.is_pooled,
            feature_names=option.feature_names,
            output_dtype=option.output_dtype,
            key_value_params=option.key_value_params,
        )
        setattr(split, SPLIT_COLUMNS_ATTR, [(int(a), int(b)) for a, b in columns])
        self.populate_estimates([split])
        return split

    def _capacity_topology(self) -> Topology:
        return reserved_topology(self._reservation, self._topology)

    def _too_big_tables(self, options: list[ShardingOption]) -> dict[str, tuple[int, int]]:
        """Names of DreamShard tables whose table-wise storage fits no device, with
        (bytes needed, largest device's bytes)."""
        topo = self._capacity_topology()
        tier = memory_tier(topo)
        biggest = max(device_capacity(topo))
        world = self._topology.world_size
        out: dict[str, tuple[int, int]] = {}
        for o in options:
            if not is_dreamshard_option(o) or option_bytes(o, tier) <= biggest:
                continue
            width = self.split_widths.get(o.fqn)
            spec = self.table_spec(o)
            most = split_counts(spec, world, width)[-1] if width else 1
            shard_share = column_shards(spec, most)[0].dim / spec.dim
            if option_bytes(o, tier) * shard_share > biggest:  # no split fits either
                out[o.name] = (option_bytes(o, tier), biggest)
        return out

    def _too_big_message(self, name: str) -> str:
        need, biggest = self._too_big[name]
        tier = memory_tier(self._topology).upper()
        return (
            f"table {name!r} needs {need} bytes of {tier} table-wise, more than any device "
            f"has after TorchRec's storage reservation ({biggest} bytes), and its "
            "ParameterConstraints allow no other sharding type: allow row_wise or "
            "column_wise for it, add devices or memory, or make the table smaller"
        )


# ----------------------------------------------------------------------------------------
# Reuse statistics from sample KeyedJaggedTensor batches
# ----------------------------------------------------------------------------------------


def _reuse_hists(
    module: nn.Module, batches: Sequence[Any], world_size: int
) -> dict[str, tuple[float, ...]]:
    """Reuse histogram of every EmbeddingBagCollection table whose features are all in the
    sample batches, by the table's fully qualified name."""
    if not batches:
        return {}
    dicts = [kjt.to_dict() for kjt in batches]
    sizes = [kjt.stride() for kjt in batches]
    starts = range(0, len(dicts), world_size)
    groups = [(dicts[i : i + world_size], sum(sizes[i : i + world_size])) for i in starts]
    out: dict[str, tuple[float, ...]] = {}
    for path, child in module.named_modules():
        if not isinstance(child, EmbeddingBagCollection):
            continue
        for config in child.embedding_bag_configs():
            try:
                stats = [group_stats(config.name, config.feature_names, g, n) for g, n in groups]
            except ValueError:  # a feature missing from the samples: TorchRec's defaults
                continue
            stats = [s for s in stats if s is not None]
            if stats:
                out[f"{path}.{config.name}"] = merge_stats(stats)[1]
    return out
