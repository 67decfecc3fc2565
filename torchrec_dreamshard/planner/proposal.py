"""Shared types and helpers of the DreamShard planner components.

The DreamShard policy places *table-wise* tables that run on the *fused* FBGEMM kernel, and
the column-wise shards of the tables it splits (:mod:`torchrec_dreamshard.data.splits`); every
other sharding option (row-wise, data-parallel, UVM caching, ...) is placed by TorchRec's own
partitioner. :class:`DreamShardProposal` is what the proposer hands the partitioner. The
helpers say which options the policy places, read device memory off a ``Topology`` and
build the :class:`~torchrec_dreamshard.data.tasks.Task` the cost network rates
(the :class:`~torchrec_dreamshard.data.tables.TableSpec` of an option:
:mod:`~torchrec_dreamshard.planner.option_specs`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.types import ShardingOption, Storage, Topology
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.device_report import device_table

DREAMSHARD_SHARDING_TYPE: str = ShardingType.TABLE_WISE.value
DREAMSHARD_COMPUTE_KERNEL: str = EmbeddingComputeKernel.FUSED.value
SPLIT_SHARDING_TYPE: str = ShardingType.COLUMN_WISE.value
PLACEMENT_MODES: tuple[str, ...] = ("safe", "greedy", "search")  # see policy.agent


class DreamShardProposal(list[ShardingOption]):
    """A proposal of :class:`~torchrec_dreamshard.planner.proposers.DreamShardProposer`:
    one option per table, as every TorchRec proposal, and which of them the policy places.
    :class:`~torchrec_dreamshard.planner.partitioners.DreamShardPartitioner` places the
    others with TorchRec's partitioner, then the policy's in the memory left.

    Args:
        options: one sharding option per table (no ranks).
        policy: the fully qualified names of the options the policy places (table-wise,
            fused, of ``EmbeddingBagCollection`` tables).
        split_widths: the narrowest column-wise shard of each policy table that may be
            split, by fully qualified name.
    """

    def __init__(
        self,
        options: Iterable[ShardingOption] = (),
        policy: Iterable[str] = (),
        split_widths: dict[str, int] | None = None,
    ) -> None:
        super().__init__(options)
        self.policy: frozenset[str] = frozenset(policy)
        self.split_widths: dict[str, int] = dict(split_widths or {})

    def policy_options(self) -> list[ShardingOption]:
        """The options the policy places, in proposal order."""
        return [o for o in self if o.fqn in self.policy]

    def other_options(self) -> list[ShardingOption]:
        """The options TorchRec's partitioner places, in proposal order."""
        return [o for o in self if o.fqn not in self.policy]


def is_dreamshard_option(option: ShardingOption) -> bool:
    """Whether the policy places this option (table-wise on the fused kernel)."""
    return (
        option.sharding_type == DREAMSHARD_SHARDING_TYPE
        and option.compute_kernel == DREAMSHARD_COMPUTE_KERNEL
    )


def is_policy_option(option: ShardingOption) -> bool:
    """Whether the policy can place ``option``: table-wise, fused, of an EBC table."""
    return is_dreamshard_option(option) and isinstance(option.module[1], EmbeddingBagCollection)


def is_split_option(option: ShardingOption) -> bool:
    """Whether the cost network rates this option: column-wise on the fused kernel, of an
    EBC table (each shard a table of its columns)."""
    return (
        option.sharding_type == SPLIT_SHARDING_TYPE
        and option.compute_kernel == DREAMSHARD_COMPUTE_KERNEL
        and isinstance(option.module[1], EmbeddingBagCollection)
    )


def memory_tier(topology: Topology) -> str:
    """``"hbm"`` on accelerators, ``"ddr"`` for a CPU compute device (TorchRec's rule)."""
    return "hbm" if topology.compute_device in ("cuda", "mtia") else "ddr"


def storage_bytes(storage: Storage | None, tier: str) -> int:
    """Bytes of ``storage`` on memory ``tier`` (0 when unknown)."""
    return 0 if storage is None else int(getattr(storage, tier))


def device_capacity(topology: Topology) -> list[int]:
    """Each device's capacity on the tier the tables live on, in bytes."""
    tier = memory_tier(topology)
    return [storage_bytes(d.storage, tier) for d in topology.devices]


def option_bytes(option: ShardingOption, tier: str) -> int:
    """Total storage of a sharding option on ``tier`` (TorchRec's storage estimate)."""
    return sum(storage_bytes(s.storage, tier) for s in option.shards)


def prediction_task(specs: Sequence[TableSpec], num_devices: int, batch_size: int) -> Task:
    """A task for *rating* placements: memory is set so that any placement is valid."""
    return Task(
        tables=list(specs),
        num_devices=num_devices,
        memory_bytes=max(1, sum(t.size_bytes for t in specs)),
        batch_size=batch_size,
    )


@dataclass
class PlanPrediction:
    """The cost network's view of a plan, per rank.

    Args:
        fwd_ms, bwd_ms, comm_ms: predicted fused-kernel forward, backward and all-to-all
            times of the DreamShard-placed tables on each rank.
        other_ms: TorchRec's perf estimate of the shards TorchRec placed, per rank.
        step_ms: predicted overall embedding step cost of the plan: the cost network's
            step cost plus the largest ``other_ms``.
        tables: number of tables on each rank.
        step_log_std: the cost network's uncertainty about its step cost (the ensemble
            members' spread of log step cost).
        penalty: how many of those spreads the planner's rating adds (the safety net's).
    """

    fwd_ms: list[float]
    bwd_ms: list[float]
    comm_ms: list[float]
    other_ms: list[float]
    step_ms: float
    tables: list[int] = field(default_factory=list)
    step_log_std: float = 0.0
    penalty: float = 0.0

    @property
    def score_ms(self) -> float:
        """The rating the planner minimises, as the safety net rates its candidates: the
        cost network's step cost scaled by ``exp(penalty * step_log_std)`` (a plan only
        some ensemble members believe in rates worse), plus the largest ``other_ms``."""
        net = self.step_ms - max(self.other_ms, default=0.0)
        return net * math.exp(self.penalty * self.step_log_std) + max(self.other_ms, default=0.0)

    def total_ms(self, rank: int) -> float:
        return self.fwd_ms[rank] + self.bwd_ms[rank] + self.comm_ms[rank] + self.other_ms[rank]

    def to_dict(self) -> dict:
        return {
            "step_ms": self.step_ms,
            "step_log_std": self.step_log_std,
            "per_device": [
                {
                    "rank": r,
                    "tables": self.tables[r] if self.tables else None,
                    "fwd_ms": self.fwd_ms[r],
                    "bwd_ms": self.bwd_ms[r],
                    "comm_ms": self.comm_ms[r],
                    "other_ms": self.other_ms[r],
                }
                for r in range(len(self.fwd_ms))
            ],
        }

    def format(self) -> list[str]:
        """Rows of a per-rank table, as the planner logs it."""
        rows = device_table(
            [
                {
                    "tables": self.tables[r] if self.tables else 0,
                    "fwd_ms": self.fwd_ms[r],
                    "bwd_ms": self.bwd_ms[r],
                    "comm_ms": self.comm_ms[r],
                    "other_ms": self.other_ms[r],
                }
                for r in range(len(self.fwd_ms))
            ],
            figures=("fwd_ms", "bwd_ms", "comm_ms", "other_ms"),
            label="rank",
        )
        rows.append(f"Predicted step cost: {self.step_ms:.3f} ms")
        return rows
