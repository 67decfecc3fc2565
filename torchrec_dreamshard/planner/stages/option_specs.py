"""A sharding option as the cost network sees it: the
:class:`~torchrec_dreamshard.data.tables.TableSpec` of its table (:func:`spec_for_option`,
the one conversion), the specs of its shards (:func:`shard_specs`), and ``OptionSpecs``,
the planner's spec of every option, shared by the planner's components.

The enumerator, the proposer, the partitioner, the perf model and the stats all see a table
the same way:
its shape and element size from the option's tensor, its pooling factor from the option's
``input_lengths`` (``ParameterConstraints.pooling_factors``), and, when the planner was
given sample batches, the reuse histogram and the bag-length cv (how bursty its bags are,
:func:`~torchrec_dreamshard.data.table_stats.gamma_poisson_cv`) measured from them, else
those declared. The cost network sees no cv, but every kernel the planner measures
(calibration, verification) is fed bags of it. The planner calls
:meth:`OptionSpecs.observe` with the module before it plans, so the statistics are there
whichever enumerator (ours or a user's) builds the search space.
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
"""How a planner component sees an option's table (:func:`spec_for_option`, or the
planner's :class:`OptionSpecs`)."""


def spec_for_option(
    option: ShardingOption,
    reuse_hist: Sequence[float] | None = None,
    bag_length_cv: float | None = None,
) -> TableSpec:
    """The :class:`TableSpec` of a table-wise option, named by its fully qualified name,
    with ``reuse_hist`` and ``bag_length_cv`` (``None``: unknown, even bags).

    The pooling factor is the sum of the option's ``input_lengths`` (the
    ``ParameterConstraints.pooling_factors`` of its features, TorchRec's default 1.0 each),
    as the fused kernel sees all of a table's features together.
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
    """The tables the cost network sees for an option: ``[spec]`` for a table-wise one,
    one spec per shard (``name@start:end``) for a column-wise one, in shard order."""
    if not is_split_option(option):
        return [spec]
    return [shard_spec(spec, a, b) for a, b in option_columns(option)]


class OptionSpecs:
    """Table specs by fully qualified name, with reuse and bag-length cv measured from
    sample batches.

    Args:
        sample_batches: optional ``KeyedJaggedTensor`` batches (per-rank batches) of the
            model's sparse features; consecutive groups of ``world_size`` batches are taken
            together as the global batch a table-wise kernel sees.
        world_size: ranks in the topology.
        declared: reuse histograms the user gives (17 fractions each, a task file's
            ``reuse_hist``), for tables the sample batches do not measure; keyed by table
            name, as TorchRec's ``constraints`` are, or by fully qualified name
            (:func:`resolve_table_keys`, when the module is observed).
        declared_cvs: bag-length cvs the user gives (a task file's ``bag_length_cv``), for
            tables the sample batches do not measure; keyed as ``declared``.

    Raises:
        ValueError: a declared cv is not a number in ``[0, MAX_BAG_LENGTH_CV]`` (the
            message names its table); at :meth:`observe`, a key that names no table of
            the module, or a table name that several of its tables share.

    :meth:`learn` takes pooling factors and reuse over the options' own (what a running job
    fed its tables).
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
        """Measure the reuse statistics and bag-length cvs of ``module``'s tables (over the
        declared ones; a table measured as even keeps no declared cv) and forget earlier
        specs."""
        self.specs = {}
        self._declared = resolve_table_keys(self._declared, module, "reuse_hists")
        self._declared_cvs = resolve_table_keys(self._declared_cvs, module, "bag_length_cvs")
        self._reuse = {**self._declared, **reuse_hists(module, self._samples, self._world)}
        self._cvs = {**self._declared_cvs, **bag_length_cvs(module, self._samples, self._world)}

    @property
    def reuse(self) -> dict[str, tuple[float, ...]]:
        """The reuse histograms measured or taken, by fully qualified name."""
        return dict(self._reuse)

    @property
    def bag_length_cvs(self) -> dict[str, float]:
        """The bag-length cvs measured or declared (tables of bursty bags only), by fully
        qualified name."""
        return {fqn: cv for fqn, cv in self._cvs.items() if cv is not None}

    def learn(self, pooling: Mapping[str, float], reuse: Mapping[str, Sequence[float]]) -> None:
        """Take these pooling factors and reuse histograms (by fully qualified name; what a
        running job fed its tables) over the options' own and the sample batches'."""
        self.specs = {}
        self._pooling = dict(pooling)
        self._reuse.update({fqn: tuple(h) for fqn, h in reuse.items()})

    def reuse_key(self) -> list[tuple[str, Any]]:
        """The measured reuse histograms, the pooling factors taken over the options' and
        the bag-length cvs (nothing where no table has one), sorted by table (part of the
        planner's context)."""
        cvs = sorted(("bag_length_cv", *c) for c in self.bag_length_cvs.items())
        pooling = sorted(("pooling", *p) for p in self._pooling.items())
        return sorted(self._reuse.items()) + pooling + cvs

    def __call__(self, option: ShardingOption) -> TableSpec:
        """The spec of ``option``'s table (with measured reuse and cv, if any)."""
        spec = self.specs.get(option.fqn)
        if spec is None:
            fqn = option.fqn
            spec = spec_for_option(option, self._reuse.get(fqn), self._cvs.get(fqn))
            if option.fqn in self._pooling:
                spec = dataclasses.replace(spec, pooling_factor=self._pooling[option.fqn])
            self.specs[option.fqn] = spec
        return spec


def checked_cvs(cvs: Mapping[str, float] | None) -> dict[str, float]:
    """The declared bag-length cvs, as floats by fully qualified name.

    Raises:
        ValueError: ``cvs`` is not a mapping, or a cv is no number in
            ``[0, MAX_BAG_LENGTH_CV]`` (named with its table).
    """
    if cvs is None:
        return {}
    if not isinstance(cvs, Mapping):
        raise ValueError(
            "bag_length_cvs must map tables' fully qualified names to cvs, got "
            f"{type(cvs).__name__}"
        )
    return {str(fqn): checked_cv(cv, f"bag_length_cvs[{fqn!r}]") for fqn, cv in cvs.items()}


def resolve_table_keys(values: Mapping[str, Any], module: nn.Module, what: str) -> dict[str, Any]:
    """``values`` keyed by the fully qualified names of ``module``'s tables: a key may be a
    table's name (as TorchRec's ``constraints`` are keyed) or its fully qualified name.

    Args:
        values: what the user gave per table (``reuse_hists``, ``bag_length_cvs``).
        module: the model planned.
        what: the argument's name, for the errors.

    Returns:
        The same values by fully qualified name.

    Raises:
        ValueError: a key that names no table of ``module``, a table name that several of
            its tables share (give the fully qualified name), or two keys for one table.
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
    """The sample batches' ``to_dict()``s in consecutive groups of ``world_size`` (the
    global batch a table-wise kernel sees), each with its samples."""
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
    """Bag-length cv (:func:`~torchrec_dreamshard.data.table_stats.gamma_poisson_cv`;
    ``None``: even bags) of every EmbeddingBagCollection table whose features are all in
    the sample batches and hold ids, by the table's fully qualified name."""
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
    """Reuse histogram of every EmbeddingBagCollection table whose features are all in the
    sample batches, by the table's fully qualified name."""
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
