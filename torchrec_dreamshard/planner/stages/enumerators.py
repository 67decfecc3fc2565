"""``DreamShardEnumerator``: the search space DreamShard plans.

A table the policy can place (a bag table allowed table-wise on the fused kernel that fits
a device, whole or split) gets its table-wise fused option, a column-wise option per shard
count its constraints allow, and one option of each other type the type choice offers
(:func:`~torchrec_dreamshard.planner.type_choice.type_offers.offered_types`). Every other
table gets TorchRec's options, and TorchRec plans it.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Sequence

from torch import nn
from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator
from torchrec.distributed.planner.types import (
    ParameterConstraints,
    Shard,
    ShardEstimator,
    ShardingOption,
    StorageReservation,
    Topology,
)
from torchrec.distributed.types import ModuleSharder, ShardingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from torchrec_dreamshard.cost.sharding_types import alternative_kernels
from torchrec_dreamshard.cost.storage_correction import CorrectionSource
from torchrec_dreamshard.data.splits import column_shards, split_counts
from torchrec_dreamshard.planner.adapters.device_memory import (
    device_capacity,
    memory_tier,
    option_bytes,
)
from torchrec_dreamshard.planner.adapters.torchrec_adapter import reserved_topology
from torchrec_dreamshard.planner.stages.corrected_storage import CorrectedStorage
from torchrec_dreamshard.planner.stages.option_kinds import (
    DREAMSHARD_COMPUTE_KERNEL,
    DREAMSHARD_SHARDING_TYPE,
    SPLIT_SHARDING_TYPE,
    is_dreamshard_option,
)
from torchrec_dreamshard.planner.stages.option_specs import SpecFn, spec_for_option
from torchrec_dreamshard.planner.stages.search_space import column_wise_option, min_shard_width
from torchrec_dreamshard.planner.stages.shard_estimators import CostNetShardEstimator
from torchrec_dreamshard.planner.steps.plan_agent import bound_agent
from torchrec_dreamshard.planner.type_choice.type_offers import offered_types
from torchrec_dreamshard.policy.protocol import PlacementAgent
from torchrec_dreamshard.torchrec_compat import HookedEnumerator

logger: logging.Logger = logging.getLogger(__name__)


class DreamShardEnumerator(HookedEnumerator):
    """TorchRec's enumerator, narrowed to DreamShard's options for the tables it places.

    Args:
        batch_size: TorchRec's per-rank batch.
        agent: the DreamShard agent; its cost network prices our options.
        storage_reservation: a table whose table-wise storage fits no device after it is
            left to TorchRec (when its constraints allow another type).
        spec_fn: the planner's table specs (default: shapes and pooling only).
        estimator: replaces the cost network and TorchRec's storage estimator.
        storage_correction: a running job's factors over TorchRec's storage estimate.
    """

    def __init__(
        self,
        topology: Topology,
        batch_size: int,
        constraints: dict[str, ParameterConstraints] | None = None,
        agent: PlacementAgent | None = None,
        storage_reservation: StorageReservation | None = None,
        spec_fn: SpecFn | None = None,
        estimator: ShardEstimator | list[ShardEstimator] | None = None,
        storage_correction: CorrectionSource | None = None,
    ) -> None:
        self._topology = topology
        self._reservation = storage_reservation
        self.table_spec: SpecFn = spec_fn or spec_for_option
        self.fallback_fqns: set[str] = set()
        self._cw_widths: dict[str, int] = {}
        self._constraints_by_name = constraints or {}
        self._too_big: set[str] = set()
        self._types: dict[str, list[str]] = {}
        self._ours: set[str] = set()  # the tables the policy places
        self._offered: dict[str, dict[str, str]] = {}  # other types offered, by table
        self._local_batch = batch_size
        self._agent = agent
        self._stored_for: object | None = None  # the agent that priced the kept space
        if estimator is None:
            perf = CostNetShardEstimator(
                topology,
                constraints,
                agent,
                batch_size * topology.world_size,
                spec_fn=self.table_spec,
                policy_table=self._ours.__contains__,
            )
            estimator = [
                perf,
                EmbeddingStorageEstimator(topology=topology, constraints=constraints),
            ]
        if storage_correction is not None:  # after TorchRec's storage estimate
            given = estimator if isinstance(estimator, list) else [estimator]
            estimator = [*given, CorrectedStorage(storage_correction)]
        super().__init__(topology, batch_size, constraints, estimator)

    def enumerate(
        self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]]
    ) -> list[ShardingOption]:
        """Sharding options for ``module`` (the same module and sharders give a copy of the
        stored search space, as TorchRec's)."""
        stored = self.stored_search_space(module, sharders)
        pricing = bound_agent(self._agent) if self._agent is not None else None
        if stored is not None and self._stored_for is pricing:
            return copy_options(stored)
        self._too_big, self._cw_widths, self._types = set(), {}, {}
        self._offered = offered_types(
            module, self._topology, self._local_batch, self._constraints_by_name
        )
        self._ours.clear()  # cleared in place: the estimator holds it
        # uncached: TorchRec's cache would skip the second pass, and its deep copy is slow
        options = self.enumerate_uncached(module, sharders)
        too_big = self._too_big_tables(options)
        if too_big:
            self._too_big = too_big
            self._ours -= too_big
            redo = self.enumerate_uncached(module, sharders)
            options = [o for o in options if o.name not in too_big] + [
                o for o in redo if o.name in too_big
            ]
        options += self._split_options(options)
        self.fallback_fqns = {o.fqn for o in options if not is_dreamshard_option(o)}
        if self.fallback_fqns:
            logger.info(
                "DreamShard leaves %d table(s) to TorchRec's planner: %s",
                len(self.fallback_fqns),
                sorted(self.fallback_fqns),
            )
        self.store_search_space(module, sharders, copy_options(options))
        self._stored_for = pricing  # priced by this agent: another re-enumerates
        return options

    # -- TorchRec hooks -------------------------------------------------------------------

    def filter_sharding_types(
        self, name: str, allowed_sharding_types: list[str], sharder_key: str = ""
    ) -> list[str]:
        types = super().filter_sharding_types(name, allowed_sharding_types, sharder_key)
        types = self._runnable_types(name, types, sharder_key)
        self._types[name] = types
        if name in self._too_big:
            return [t for t in types if t != DREAMSHARD_SHARDING_TYPE]
        if self._eligible(name, types, sharder_key):
            self._ours.add(name)
            if self._eligible(name, types, sharder_key, SPLIT_SHARDING_TYPE):
                self._cw_widths[name] = min_shard_width(self._constraints_by_name, name)
            offered = self._offered.get(name, {})
            others = [t for t in types if t in offered]
            return [DREAMSHARD_SHARDING_TYPE, *others]
        return types

    def filter_compute_kernels(
        self, name: str, allowed_compute_kernels: list[str], sharding_type: str
    ) -> list[str]:
        kernels = super().filter_compute_kernels(name, allowed_compute_kernels, sharding_type)
        if name in self._too_big or name not in self._ours:
            return kernels
        if sharding_type == DREAMSHARD_SHARDING_TYPE and DREAMSHARD_COMPUTE_KERNEL in kernels:
            return [DREAMSHARD_COMPUTE_KERNEL]
        wanted = alternative_kernels().get(sharding_type)  # the type choice's kernel
        return [wanted] if wanted in kernels else kernels

    # -- helpers --------------------------------------------------------------------------

    def _runnable_types(self, name: str, types: list[str], sharder_key: str) -> list[str]:
        """``types`` without data-parallel for a sequence table on CPU ranks, where
        FBGEMM's dense kernel pools whatever pooling mode it is given."""
        sharder = self.sharder_for(sharder_key)
        dp = ShardingType.DATA_PARALLEL.value
        if (
            self._topology.compute_device != "cpu"
            or dp not in types
            or sharder is None
            or not issubclass(sharder.module_type, EmbeddingCollection)
        ):
            return types
        runnable = [t for t in types if t != dp]
        if not runnable:
            raise ValueError(
                f"sequence table {name!r} (an EmbeddingCollection) is constrained to "
                "data_parallel, which does not run on CPU ranks (FBGEMM's CPU dense kernel "
                "pools its lookups); allow it table_wise or another type in its "
                "ParameterConstraints.sharding_types"
            )
        return runnable

    def _eligible(
        self,
        name: str,
        types: list[str],
        sharder_key: str,
        sharding_type: str = DREAMSHARD_SHARDING_TYPE,
    ) -> bool:
        """``sharding_type`` is allowed on the fused kernel of a bag table."""
        sharder = self.sharder_for(sharder_key)
        if sharder is None or sharding_type not in types:
            return False
        if not issubclass(sharder.module_type, EmbeddingBagCollection):
            return False
        device = self._topology.compute_device
        kernels = super().filter_compute_kernels(
            name, sharder.compute_kernels(sharding_type, device), sharding_type
        )
        return DREAMSHARD_COMPUTE_KERNEL in kernels

    def _split_options(self, options: list[ShardingOption]) -> list[ShardingOption]:
        """An equal-shard column-wise option per allowed shard count of each splittable
        table."""
        world = self._topology.world_size
        out = []
        for o in options:
            width = self._cw_widths.get(o.name)
            if not width or not is_dreamshard_option(o):
                continue
            spec = self.table_spec(o)
            for n in split_counts(spec, world, width):
                step = spec.dim // n
                columns = [(k * step, (k + 1) * step) for k in range(n)]
                out.append(column_wise_option(self, o, columns))
        return out

    def _too_big_tables(self, options: list[ShardingOption]) -> set[str]:
        """DreamShard tables that fit no device, whole or split, and may take another type."""
        topo = reserved_topology(self._reservation, self._topology)
        tier = memory_tier(topo)
        biggest = max(device_capacity(topo))
        world = self._topology.world_size
        out: set[str] = set()
        for o in options:
            if not is_dreamshard_option(o) or option_bytes(o, tier) <= biggest:
                continue
            width = self._cw_widths.get(o.name)
            spec = self.table_spec(o)
            most = (split_counts(spec, world, width) or [1])[-1] if width else 1
            shard_share = column_shards(spec, most)[0].dim / spec.dim
            other_type = any(t != DREAMSHARD_SHARDING_TYPE for t in self._types.get(o.name, []))
            if option_bytes(o, tier) * shard_share > biggest and other_type:
                out.add(o.name)
        return out


def copy_options(options: Sequence[ShardingOption]) -> list[ShardingOption]:
    """A copy of ``options`` that planning cannot change, as TorchRec's enumerator keeps.

    Tensors, modules and shards' ``Storage`` and ``Perf`` (replaced, never changed in
    place) are shared: ``copy.deepcopy`` is ten times slower.
    """
    out = []
    for option in options:
        new = copy.copy(option)
        for key, value in vars(option).items():
            if isinstance(value, list):
                setattr(new, key, list(value))
            elif dataclasses.is_dataclass(value) and key != "_module":
                setattr(new, key, copy.copy(value))
        new.shards = [_copy_shard(s) for s in option.shards]
        out.append(new)
    return out


def _copy_shard(shard: Shard) -> Shard:
    return Shard(
        size=list(shard.size),
        offset=list(shard.offset),
        storage=shard.storage,
        perf=shard.perf,
        rank=shard.rank,
    )
