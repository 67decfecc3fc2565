"""The job's real inputs: :class:`InputRecorder` copies each sharded module's input on sampled
steps; :class:`ObservedInputs` turns them into the pooling factors and batches a re-plan uses."""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

MAX_INPUT_STEPS = 4  # sampled steps whose inputs are kept (the newest)
MAX_STEP_IDS = 2_000_000  # ids kept per rank and step (16 MB); beyond, lengths only

# One rank's inputs on one sampled step: feature -> (lengths, values or None beyond the cap)
StepInputs = dict[str, tuple[torch.Tensor, torch.Tensor | None]]


def sharded_modules(dmp: nn.Module | None) -> list[nn.Module]:
    """The sharded embedding modules of a DMP model (those with an ``input_dist``)."""
    from torchrec.distributed.types import ShardedModule

    if dmp is None:
        return []
    return [m for m in dmp.modules() if isinstance(m, ShardedModule) and hasattr(m, "input_dist")]


class InputRecorder:
    """Copies each sharded module's input on the steps it is told to record, by wrapping
    the instances' ``input_dist`` (:meth:`attach` again after a reshard)."""

    def __init__(self, dmp: nn.Module | None) -> None:
        self.recording = False
        self.steps: deque[StepInputs] = deque(maxlen=MAX_INPUT_STEPS)
        self._current: StepInputs = {}
        self.attach(dmp)

    def attach(self, dmp: nn.Module | None) -> None:
        """Wrap the ``input_dist`` of ``dmp``'s sharded modules not wrapped yet."""
        from torchrec_dreamshard.torchrec_compat import wrap_input_dist

        for module in sharded_modules(dmp):
            if getattr(module.input_dist, "_dreamshard_recorder", None) is self:
                continue
            wrap_input_dist(module, self._wrap)

    def _wrap(self, input_dist: Any) -> Any:
        def recorded(ctx: Any, features: Any, *args: Any, **kwargs: Any) -> Any:
            if self.recording:
                self._record(features)
            return input_dist(ctx, features, *args, **kwargs)

        recorded._dreamshard_recorder = self  # type: ignore[attr-defined]
        return recorded

    def _record(self, features: Any) -> None:
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        if not isinstance(features, KeyedJaggedTensor) or features.variable_stride_per_key():
            return  # a TensorDict or a variable batch per feature: not recorded
        kept = sum(v.numel() for _, v in self._current.values() if v is not None)
        for key, jt in features.to_dict().items():
            values = jt.values()
            keep = kept + values.numel() <= MAX_STEP_IDS
            kept += values.numel() if keep else 0
            self._current[key] = (
                jt.lengths().detach().clone(),
                values.detach().clone() if keep else None,
            )

    def start(self) -> None:
        """Record the inputs of the step now starting."""
        self._current = {}
        self.recording = True

    def take(self) -> StepInputs:
        """Stop recording and hand over what the step fed."""
        self.recording = False
        fed, self._current = self._current, {}
        return fed

    def keep(self, fed: StepInputs) -> None:
        """Keep what a sampled step fed (from :meth:`take`)."""
        if fed:
            self.steps.append(fed)

    def stop(self, keep: bool = True) -> None:
        """Stop recording; keep what the step fed (``keep``) or drop it."""
        fed = self.take()
        if keep:
            self.keep(fed)


def pooling_sums(steps: Iterable[StepInputs]) -> dict[str, tuple[int, int]]:
    """Per feature, ``(ids, samples)`` summed over ``steps``."""
    out: dict[str, tuple[int, int]] = {}
    for step in steps:
        for key, (lengths, _) in step.items():
            ids, samples = out.get(key, (0, 0))
            out[key] = (ids + int(lengths.sum()), samples + int(lengths.numel()))
    return out


def with_fields(given: Any, **fields: Any) -> Any:
    """``given`` (``ParameterConstraints`` or ``None``) with ``fields`` set."""
    from torchrec.distributed.planner.types import ParameterConstraints

    if given is None:
        return ParameterConstraints(**fields)
    return dataclasses.replace(given, **fields)


@dataclasses.dataclass
class TableInput:
    """One table's features, as the planner was told and as the job fed them."""

    fqn: str
    name: str
    features: list[str]
    declared: list[float]  # the constraints' pooling factor per feature (TorchRec's 1.0 default)
    observed: list[float]  # ids per sample per feature, over the sampled steps

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.fqn,
            "declared_pooling": sum(self.declared),
            "observed_pooling": sum(self.observed),
        }


def embedding_tables(model: nn.Module) -> list[tuple[str, str, list[str]]]:
    """Every ``(fqn, table name, feature names)`` of ``model``'s embedding tables."""
    from torchrec_dreamshard.data.table_stats import table_configs

    return [(fqn, c.name, list(c.feature_names)) for fqn, c in table_configs(model)]


class ObservedInputs:
    """What the job fed its tables.

    Args:
        tables: ``(fqn, name, features)`` of the model's tables (:func:`embedding_tables`).
        sums: per feature, ``(ids, samples)`` over every rank's sampled steps
            (:func:`pooling_sums`).
        constraints: the constraints the planner was given (by table name).
        ranks: per rank, its recorded steps, for :meth:`batches`.
    """

    def __init__(
        self,
        tables: Sequence[tuple[str, str, list[str]]],
        sums: Mapping[str, tuple[int, int]],
        constraints: Mapping[str, Any] | None,
        ranks: Sequence[Sequence[StepInputs]] = (),
    ) -> None:
        self.world = len(ranks)
        self.steps = min((len(r) for r in ranks), default=0)
        self._ranks = [list(r)[len(r) - self.steps :] for r in ranks]
        self.constraints_given = dict(constraints or {})
        self.tables: list[TableInput] = []
        for fqn, name, features in tables:
            if not all(sums.get(f, (0, 0))[1] > 0 for f in features):
                continue  # a feature the sampled steps did not feed: TorchRec's defaults stay
            given = self.constraints_given.get(name)
            declared = list(getattr(given, "pooling_factors", None) or [1.0] * len(features))
            observed = [sums[f][0] / sums[f][1] for f in features]
            self.tables.append(TableInput(fqn, name, list(features), declared, observed))

    def constraints(self) -> dict[str, Any]:
        """The given constraints with each observed table's pooling factors as observed."""
        out = dict(self.constraints_given)
        for t in self.tables:
            pooling = [max(p, 1e-3) for p in t.observed]  # TorchRec divides by it
            out[t.name] = with_fields(out.get(t.name), pooling_factors=pooling)
        return out

    def batches(self) -> list[Any]:
        """The recorded inputs as ``KeyedJaggedTensor`` batches, step by step and rank by
        rank (``DreamShardPlanner(sample_batches=...)``); empty where a step fed more ids
        than :data:`MAX_STEP_IDS`."""
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        if any(v is None for r in self._ranks for step in r for _, v in step.values()):
            return []
        out = []
        for i in range(self.steps):
            for r in range(self.world):
                step = self._ranks[r][i]
                keys = sorted(step)
                if not keys:
                    continue
                out.append(
                    KeyedJaggedTensor.from_lengths_sync(
                        keys=keys,
                        values=torch.cat([step[k][1] for k in keys]),
                        lengths=torch.cat([step[k][0] for k in keys]),
                    )
                )
        return out

    def fed(self) -> dict[str, list[float]]:
        """Each observed table's ids per sample per feature, by fqn."""
        return {t.fqn: list(t.observed) for t in self.tables}

    def pooling_by_fqn(self) -> dict[str, float]:
        """Each observed table's pooling factor (its features' together), by fqn."""
        return {t.fqn: sum(t.observed) for t in self.tables}

    def mispriced(self, tolerance: float = 0.1) -> list[TableInput]:
        """The tables whose observed pooling is more than ``tolerance`` off the declared."""
        return [
            t
            for t in self.tables
            if abs(sum(t.observed) - sum(t.declared)) > tolerance * max(sum(t.declared), 1e-9)
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "tables": [t.to_dict() for t in self.tables],
            "mispriced": [t.fqn for t in self.mispriced()],
        }
