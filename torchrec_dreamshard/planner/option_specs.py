"""A sharding option as the cost network sees it: the
:class:`~torchrec_dreamshard.data.tables.TableSpec` of its table (:func:`spec_for_option`,
the one conversion), the specs of its shards (:func:`shard_specs`), and ``OptionSpecs``,
the planner's spec of every option, shared by the planner's components.

The enumerator, the proposer, the partitioner, the perf model and the stats all see a table
the same way:
its shape and element size from the option's tensor, its pooling factor from the option's
``input_lengths`` (``ParameterConstraints.pooling_factors``), and, when the planner was
given sample batches, the reuse histogram measured from them. The planner calls
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
from torchrec_dreamshard.data.table_stats import group_stats, merge_stats, table_configs
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.planner.option_kinds import is_split_option

SpecFn = Callable[[ShardingOption], TableSpec]
"""How a planner component sees an option's table (:func:`spec_for_option`, or the
planner's :class:`OptionSpecs`)."""


def spec_for_option(option: ShardingOption, reuse_hist: Sequence[float] | None = None) -> TableSpec:
    """The :class:`TableSpec` of a table-wise option, named by its fully qualified name.

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
    """Table specs by fully qualified name, with reuse measured from sample batches.

    Args:
        sample_batches: optional ``KeyedJaggedTensor`` batches (per-rank batches) of the
            model's sparse features; consecutive groups of ``world_size`` batches are taken
            together as the global batch a table-wise kernel sees.
        world_size: ranks in the topology.
        declared: reuse histograms the user gives (17 fractions each, by fully qualified
            name: a task file's ``reuse_hist``), for tables the sample batches do not
            measure.

    :meth:`learn` takes pooling factors and reuse over the options' own (what a running job
    fed its tables).
    """

    def __init__(
        self,
        sample_batches: Iterable[Any] | None = None,
        world_size: int = 1,
        declared: Mapping[str, Sequence[float]] | None = None,
    ) -> None:
        self._samples = list(sample_batches) if sample_batches is not None else []
        self._world = world_size
        self._declared = {fqn: tuple(float(x) for x in h) for fqn, h in (declared or {}).items()}
        self._pooling: dict[str, float] = {}
        self._reuse: dict[str, tuple[float, ...]] = dict(self._declared)
        self.specs: dict[str, TableSpec] = {}

    def observe(self, module: nn.Module) -> None:
        """Measure the reuse statistics of ``module``'s tables (over the declared ones) and
        forget earlier specs."""
        self.specs = {}
        self._reuse = {**self._declared, **reuse_hists(module, self._samples, self._world)}

    @property
    def reuse(self) -> dict[str, tuple[float, ...]]:
        """The reuse histograms measured or taken, by fully qualified name."""
        return dict(self._reuse)

    def learn(self, pooling: Mapping[str, float], reuse: Mapping[str, Sequence[float]]) -> None:
        """Take these pooling factors and reuse histograms (by fully qualified name; what a
        running job fed its tables) over the options' own and the sample batches'."""
        self.specs = {}
        self._pooling = dict(pooling)
        self._reuse.update({fqn: tuple(h) for fqn, h in reuse.items()})

    def reuse_key(self) -> list[tuple[str, Any]]:
        """The measured reuse histograms and the pooling factors taken over the options',
        sorted by table (part of the planner's context)."""
        return sorted(self._reuse.items()) + sorted(("pooling", *p) for p in self._pooling.items())

    def __call__(self, option: ShardingOption) -> TableSpec:
        """The spec of ``option``'s table (with measured reuse, if any)."""
        spec = self.specs.get(option.fqn)
        if spec is None:
            spec = spec_for_option(option, self._reuse.get(option.fqn))
            if option.fqn in self._pooling:
                spec = dataclasses.replace(spec, pooling_factor=self._pooling[option.fqn])
            self.specs[option.fqn] = spec
        return spec


def reuse_hists(
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
    for fqn, config in table_configs(module):
        if not isinstance(config, EmbeddingBagConfig):
            continue
        try:
            stats = [group_stats(config.name, config.feature_names, g, n) for g, n in groups]
        except ValueError:  # a feature missing from the samples: TorchRec's defaults
            continue
        stats = [s for s in stats if s is not None]
        if stats:
            out[fqn] = merge_stats(stats)[1]
    return out
