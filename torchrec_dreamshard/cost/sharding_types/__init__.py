"""Every sharding type's cost strategy (a
:class:`~torchrec_dreamshard.cost.sharding.ShardingCost` per module), in one registry."""

from __future__ import annotations

from dataclasses import replace

from torchrec_dreamshard.cost.comm_topology import CommTopology
from torchrec_dreamshard.cost.sharding import (
    CostContext,
    ShardingCost,
    TableChoice,
    Terms,
    path_exchange,
)
from torchrec_dreamshard.cost.sharding_types.column_wise import ColumnWise
from torchrec_dreamshard.cost.sharding_types.data_parallel import DataParallel
from torchrec_dreamshard.cost.sharding_types.row_wise import RowWise
from torchrec_dreamshard.cost.sharding_types.table_row_wise import TableRowWise
from torchrec_dreamshard.cost.sharding_types.table_wise import TableWise

# by type, in registration order (the type choice tries alternatives in it)
STRATEGIES: dict[str, ShardingCost] = {}
# by every TorchRec sharding type priced, aliases included (table-column-wise: column-wise)
BY_TORCHREC_TYPE: dict[str, ShardingCost] = {}


def register(strategy: ShardingCost) -> ShardingCost:
    """Add ``strategy`` to the registry (a ``ValueError`` if one of its names is taken)."""
    names = (strategy.name, *strategy.aliases)
    taken = [n for n in names if n in BY_TORCHREC_TYPE]
    if taken:
        raise ValueError(f"sharding types {taken} already have a cost strategy")
    STRATEGIES[strategy.name] = strategy
    BY_TORCHREC_TYPE.update(dict.fromkeys(names, strategy))
    return strategy


for _strategy in (DataParallel(), TableWise(), ColumnWise(), RowWise(), TableRowWise()):
    register(_strategy)


def sharding_types() -> tuple[str, ...]:
    """Every sharding type priced, in registration order."""
    return tuple(STRATEGIES)


def sequence_types() -> tuple[str, ...]:
    """The types a sequence table may take."""
    return tuple(name for name, s in STRATEGIES.items() if s.sequence)


def alternative_types() -> list[ShardingCost]:
    """The types the type choice may offer a table instead of table-wise, in order."""
    return [s for s in STRATEGIES.values() if s.alternative_kernel is not None]


def alternative_kernels() -> dict[str, str]:
    """The compute kernel each alternative type is offered on, by type."""
    return {s.name: s.alternative_kernel for s in alternative_types() if s.alternative_kernel}


def checked_choice(choice: TableChoice, topo: CommTopology) -> TableChoice:
    """``choice`` with its ranks as its strategy reads them, or a ``ValueError`` naming it."""
    kind, where = choice.sharding_type, choice.label
    strategy = STRATEGIES.get(kind)
    if strategy is None:
        raise ValueError(f"{where}: unknown sharding type {kind!r}; expected {sharding_types()}")
    if not choice.pooled and not strategy.sequence:
        raise ValueError(f"{where}: a sequence table cannot be {kind}; use {sequence_types()}")
    for r in choice.ranks:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < topo.world_size:
            raise ValueError(f"{where}: rank {r!r} is out of range 0..{topo.world_size - 1}")
    return replace(choice, ranks=strategy.check_ranks(choice, topo))


def table_terms(choice: TableChoice, ctx: CostContext) -> Terms:
    """The terms of ``choice`` (validated; see :func:`checked_choice`)."""
    choice = checked_choice(choice, ctx.topology)
    terms = STRATEGIES[choice.sharding_type].terms(choice, ctx)
    if ctx.path_ms and choice.sharding_type != DataParallel.name:
        terms = terms + Terms(exchanges=(path_exchange(choice, ctx),))
    return terms


class TermsCache:
    """:func:`table_terms`, each choice's built once (valid across kernel pricings)."""

    def __init__(self) -> None:
        self._seen: dict[TableChoice, Terms] = {}

    def __call__(self, choice: TableChoice, ctx: CostContext) -> Terms:
        terms = self._seen.get(choice)
        if terms is None:
            terms = self._seen[choice] = table_terms(choice, ctx)
        return terms


__all__ = [
    "BY_TORCHREC_TYPE",
    "STRATEGIES",
    "register",
    "sequence_types",
    "sharding_types",
    "TermsCache",
    "alternative_kernels",
    "alternative_types",
    "checked_choice",
    "table_terms",
]
