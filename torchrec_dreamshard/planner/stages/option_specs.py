"""A sharding option as the cost network sees it: its table's ``TableSpec``
(:func:`spec_for_option`), its shards' specs (:func:`shard_specs`), and ``OptionSpecs``,
the planner's specs with reuse and bag-length cv measured from sample batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from torch import nn
from torchrec.distributed.planner.types import ShardingOption
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from torchrec_dreamshard.data.splits import shard_spec
from torchrec_dreamshard.data.table_stats import (
    gamma_poisson_cv,
    group_lengths,
    group_stats,
    merge_stats,
    table_configs,
)
from torchrec_dreamshard.data.tables import TableSpec, checked_cv
from torchrec_dreamshard.planner.stages.option_kinds import is_split_option

SpecFn = Callable[[ShardingOption], TableSpec]
"""How a planner component sees an option's table."""


def spec_for_option(
    option: ShardingOption,
    reuse_hist: Sequence[float] | None = None,
    bag_length_cv: float | None = None,
) -> TableSpec:
    """The :class:`TableSpec` of a table-wise option, named by its fully qualified name.

    The pooling factor is the sum of the option's ``input_lengths``: the fused kernel sees
    all of a table's features together. ``bag_length_cv`` ``None`` means even bags.
    """
    rows, dim = (int(x) for x in option.tensor.shape)
    bpe = option.tensor.element_size()
    return TableSpec(
        name=option.fqn,
        rows=rows,
        dim=dim,
        pooling_factor=float(sum(option.input_lengths)) or 1.0,
        reuse_hist=None if reuse_hist is None else tuple(reuse_hist),
        bytes_per_element=bpe if bpe in (2, 4) else 4,
        bag_length_cv=bag_length_cv,
    )


def option_columns(option: ShardingOption) -> list[tuple[int, int]]:
    """The ``(start, end)`` columns of each of an option's shards, in shard order."""
    return [(int(s.offset[1]), int(s.offset[1]) + int(s.size[1])) for s in option.shards]


def shard_specs(option: ShardingOption, spec: TableSpec) -> list[TableSpec]:
    """``[spec]`` for a table-wise option, one spec per shard for a column-wise one."""
    if not is_split_option(option):
        return [spec]
    return [shard_spec(spec, a, b) for a, b in option_columns(option)]


class OptionSpecs:
    """Table specs by fully qualified name, with reuse and bag-length cv measured from
    sample batches.

    Args:
        sample_batches: per-rank ``KeyedJaggedTensor`` batches; each ``world_size``
            consecutive ones make the global batch a table-wise kernel sees.
        declared: reuse histograms for tables the samples do not measure, keyed by table
            name or fully qualified name.
        declared_cvs: bag-length cvs for such tables, keyed as ``declared``.

    Raises:
        ValueError: a declared cv outside ``[0, MAX_BAG_LENGTH_CV]``; at :meth:`observe`,
            a key naming no table, or a table name several tables share.
    """

    def __init__(
        self,
        sample_batches: Iterable[Any] | None = None,
        world_size: int = 1,
        declared: Mapping[str, Sequence[float]] | None = None,
        declared_cvs: Mapping[str, float] | None = None,
    ) -> None:
        self._samples = list(sample_batches) if sample_batches is not None else []
        self._world = world_size
        self._declared = {fqn: tuple(float(x) for x in h) for fqn, h in (declared or {}).items()}
        self._pooling: dict[str, float] = {}
        self._reuse: dict[str, tuple[float, ...]] = dict(self._declared)
        self._declared_cvs = checked_cvs(declared_cvs)
        self._cvs: dict[str, float | None] = dict(self._declared_cvs)
        self.specs: dict[str, TableSpec] = {}

    def observe(self, module: nn.Module) -> None:
        """Measure ``module``'s reuse and bag-length cvs (over the declared ones)."""
        self.specs = {}
        self._declared = resolve_table_keys(self._declared, module, "reuse_hists")
        self._declared_cvs = resolve_table_keys(self._declared_cvs, module, "bag_length_cvs")
        self._reuse = {**self._declared, **reuse_hists(module, self._samples, self._world)}
        self._cvs = {**self._declared_cvs, **bag_length_cvs(module, self._samples, self._world)}

    @property
    def reuse(self) -> dict[str, tuple[float, ...]]:
        """The reuse histograms, by fully qualified name."""
        return dict(self._reuse)

    @property
    def bag_length_cvs(self) -> dict[str, float]:
        """The bag-length cvs of tables of bursty bags, by fully qualified name."""
        return {fqn: cv for fqn, cv in self._cvs.items() if cv is not None}

    def learn(self, pooling: Mapping[str, float], reuse: Mapping[str, Sequence[float]]) -> None:
        """Take a running job's pooling factors and reuse over the options' own."""
        self.specs = {}
        self._pooling = dict(pooling)
        self._reuse.update({fqn: tuple(h) for fqn, h in reuse.items()})

    def reuse_key(self) -> list[tuple[str, Any]]:
        """The reuse, learned pooling and cvs, sorted (part of the planner's context)."""
        cvs = sorted(("bag_length_cv", *c) for c in self.bag_length_cvs.items())
        pooling = sorted(("pooling", *p) for p in self._pooling.items())
        return sorted(self._reuse.items()) + pooling + cvs

    def __call__(self, option: ShardingOption) -> TableSpec:
        spec = self.specs.get(option.fqn)
        if spec is None:
            fqn = option.fqn
            spec = spec_for_option(option, self._reuse.get(fqn), self._cvs.get(fqn))
            if option.fqn in self._pooling:
                spec = dataclasses.replace(spec, pooling_factor=self._pooling[option.fqn])
            self.specs[option.fqn] = spec
        return spec


def checked_cvs(cvs: Mapping[str, float] | None) -> dict[str, float]:
    """The declared bag-length cvs as floats; a ValueError names a bad one."""
    if cvs is None:
        return {}
    if not isinstance(cvs, Mapping):
        raise ValueError(
            "bag_length_cvs must map tables' fully qualified names to cvs, got "
            f"{type(cvs).__name__}"
        )
    return {str(fqn): checked_cv(cv, f"bag_length_cvs[{fqn!r}]") for fqn, cv in cvs.items()}


def resolve_table_keys(values: Mapping[str, Any], module: nn.Module, what: str) -> dict[str, Any]:
    """``values`` (keyed by table name or fully qualified name) by fully qualified name.

    Raises:
        ValueError: a key naming no table, a name several tables share, or two keys for
            one table (``what`` names the argument).
    """
    fqns: dict[str, list[str]] = {}
    for fqn, config in table_configs(module):
        fqns.setdefault(fqn, [fqn])
        fqns.setdefault(config.name, []).append(fqn)
    out: dict[str, Any] = {}
    for key, value in values.items():
        found = fqns.get(key)
        if found is None:
            known = sorted({fqn for fqn, _ in table_configs(module)})
            shown = ", ".join(known[:8]) + (" ..." if len(known) > 8 else "")
            raise ValueError(
                f"{what} names {key!r}, which is no table of the model: key it by table name "
                f"(as constraints) or fully qualified name ({shown})"
            )
        if len(found) > 1:
            raise ValueError(
                f"{what} names table {key!r}, which several of the model's tables are "
                f"named: key it by fully qualified name, one of {sorted(found)}"
            )
        if found[0] in out and out[found[0]] != value:
            raise ValueError(f"{what} gives table {found[0]!r} twice, under different keys")
        out[found[0]] = value
    return out


def global_batches(batches: Sequence[Any], world_size: int) -> list[tuple[list[Any], int]]:
    """The batches' ``to_dict()``s in global batches of ``world_size``, with their sizes."""
    dicts = [kjt.to_dict() for kjt in batches]
    sizes = [kjt.stride() for kjt in batches]
    starts = range(0, len(dicts), world_size)
    return [(dicts[i : i + world_size], sum(sizes[i : i + world_size])) for i in starts]


def bag_tables(module: nn.Module) -> list[tuple[str, EmbeddingBagConfig]]:
    """``module``'s EmbeddingBagCollection tables, ``(fqn, config)``."""
    return [(f, c) for f, c in table_configs(module) if isinstance(c, EmbeddingBagConfig)]


def bag_length_cvs(
    module: nn.Module, batches: Sequence[Any], world_size: int
) -> dict[str, float | None]:
    """Bag-length cv (``None``: even bags) of each bag table the samples feed, by fqn."""
    groups = global_batches(batches, world_size)
    out: dict[str, float | None] = {}
    for fqn, config in bag_tables(module) if groups else []:
        try:
            lengths = [group_lengths(config.name, config.feature_names, g) for g, _ in groups]
        except ValueError:  # a feature missing from the samples, or variable batches
            continue
        if any(x.sum() > 0 for x in lengths):
            out[fqn] = gamma_poisson_cv(lengths)
    return out


def reuse_hists(
    module: nn.Module, batches: Sequence[Any], world_size: int
) -> dict[str, tuple[float, ...]]:
    """Reuse histogram of each bag table the samples feed, by fqn."""
    if not batches:
        return {}
    groups = global_batches(batches, world_size)
    out: dict[str, tuple[float, ...]] = {}
    for fqn, config in bag_tables(module):
        try:
            stats = [group_stats(config.name, config.feature_names, g, n) for g, n in groups]
        except ValueError:  # a feature missing from the samples: TorchRec's defaults
            continue
        stats = [s for s in stats if s is not None]
        if stats:
            out[fqn] = merge_stats(stats)[1]
    return out
