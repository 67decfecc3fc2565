"""Every TorchRec internal the package reads, in one place, checked at import (an
``ImportError`` naming what is missing; docs/torchrec_compatibility.md lists them)."""

from __future__ import annotations

import contextlib
import dis
import inspect
import threading
import types
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torchrec
from torch import nn
from torch.distributed import optim as torch_optim
from torchrec.distributed import embedding_lookup, embeddingbag, model_parallel
from torchrec.distributed.planner import planners, storage_reservations
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.types import ShardingOption, StorageReservation, Topology
from torchrec.distributed.sharding import dynamic_sharding
from torchrec.distributed.train_pipeline import train_pipelines
from torchrec.distributed.types import ModuleSharder, ShardedModule

TORCHREC_VERSION: str = torchrec.__version__  # the installed release
SUPPORTED_TORCHREC = ((1, 8), (1, 9))  # the minor releases the test suite runs on
SUPPORTED_RELEASES = (
    "TorchRec 1.8.x (with torch 2.13 and fbgemm-gpu 1.8) and TorchRec 1.9.x "
    "(with torch 2.14 and fbgemm-gpu 1.9)"
)


def torchrec_is_supported(version: str = TORCHREC_VERSION) -> bool:
    """Whether ``version`` (a TorchRec release string) is one the test suite runs on."""
    parts = version.split("+")[0].split(".")
    try:
        return (int(parts[0]), int(parts[1])) in SUPPORTED_TORCHREC
    except (IndexError, ValueError):
        return False


# -- the import-time checks -----------------------------------------------------------------


def _code_names(code: types.CodeType) -> set[str]:
    """The attribute and global names a code object and its nested code read or write."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _names_used_by(owner: type | types.ModuleType) -> set[str]:
    """Names every function of ``owner`` (a TorchRec class with its TorchRec bases, or a
    module) reads or writes."""
    scopes = [owner] if isinstance(owner, types.ModuleType) else list(owner.__mro__)
    names: set[str] = set()
    for scope in scopes:
        module = getattr(scope, "__module__", scope.__name__)
        if module.split(".")[0] != "torchrec":
            continue
        for value in vars(scope).values():
            for func in (value, getattr(value, "fget", None), getattr(value, "__func__", None)):
                code = getattr(inspect.unwrap(func), "__code__", None) if func else None
                if code is not None:
                    names |= _code_names(code)
    return names


def _signature(owner: Any, name: str, params: str) -> tuple[str, bool]:
    """``owner.name(params)``, and whether ``owner`` has it with ``params`` first."""
    func, wanted = getattr(owner, name, None), params.split(", ")
    try:
        names = list(inspect.signature(func).parameters) if callable(func) else []
    except (TypeError, ValueError):
        names = []
    names = names[1:] if names[:1] == ["self"] else names
    where = owner.__name__.rsplit(".", 1)[-1]
    return f"{where}.{name}({params})", names[: len(wanted)] == wanted


def _uses(owner: type, names: str) -> tuple[str, bool]:
    """``owner``'s ``names``, and whether its code uses them all."""
    return f"{owner.__name__}'s {names}", set(names.split(", ")) <= _names_used_by(owner)


def _reads_global(module: types.ModuleType, name: str) -> bool:
    """Whether a function of ``module`` looks ``name`` up as a global at call time."""
    for value in vars(module).values():
        code = getattr(value, "__code__", None)
        if code is not None and getattr(value, "__module__", None) == module.__name__:
            if any(
                i.opname == "LOAD_GLOBAL" and i.argval == name for i in dis.get_instructions(code)
            ):
                return True
    return False


_TAG_PARAMETERS = "src_rank, shard_id, local_shard_id, dst_rank, shard_name, is_optimizer_state"


def _checks() -> list[tuple[str, bool]]:
    """Each internal this module relies on, and whether the installed TorchRec has it."""
    enumerate_run = _code_names(inspect.unwrap(EmbeddingEnumerator.enumerate).__code__)
    stored = "_last_stored_module, _last_stored_sharders, _last_stored_search_space"
    calls = f"_filter_sharding_types, _filter_compute_kernels, populate_estimates, {stored}"
    forward = _code_names(inspect.unwrap(ShardedModule.forward).__code__)
    filter_types = "allowed_sharding_types, sharder_key"
    filter_kernels = "allowed_compute_kernels, sharding_type"
    return [
        _uses(planners.EmbeddingShardingPlanner, "_best_plan, _topology, _batch_size"),
        _uses(planners.EmbeddingShardingPlanner, "_storage_reservation"),
        _signature(EmbeddingEnumerator, "_filter_sharding_types", f"name, {filter_types}"),
        _signature(EmbeddingEnumerator, "_filter_compute_kernels", f"name, {filter_kernels}"),
        (f"EmbeddingEnumerator.enumerate using {calls}", set(calls.split(", ")) <= enumerate_run),
        ("EmbeddingEnumerator.sharder_map", isinstance(EmbeddingEnumerator.sharder_map, property)),
        _signature(
            storage_reservations,
            "_get_batch_inputs_and_shardable_parameters",
            "module, sharders, batch_size",
        ),
        _signature(
            storage_reservations, "_get_dense_tensor_size", "module, shardable_modules, multiplier"
        ),
        _uses(storage_reservations.HeuristicalStorageReservation, "_dense_tensor_estimate"),
        _uses(model_parallel.DistributedModelParallel, "_dmp_wrapped_module"),
        _uses(train_pipelines.TrainPipelineSparseDist, "_pipelined_modules"),
        ("ShardedModule.forward calling self.input_dist", "input_dist" in forward),
        _signature(dynamic_sharding, "_generate_tag", _TAG_PARAMETERS),
        (
            "dynamic_sharding looking _generate_tag up at call time, its MAX_TAG_HASH_VALUE",
            _reads_global(dynamic_sharding, "_generate_tag")
            and isinstance(getattr(dynamic_sharding, "MAX_TAG_HASH_VALUE", None), int),
        ),
        _signature(
            torch_optim, "_apply_optimizer_in_backward", "optimizer_class, params, optimizer_kwargs"
        ),
        _uses(embeddingbag.ShardedEmbeddingBagCollection, "_lookups"),
        _uses(embedding_lookup.GroupedPooledEmbeddingsLookup, "_emb_modules"),
    ]


def _missing() -> list[str]:
    """Every internal this module relies on that the installed TorchRec lacks."""
    return [what for what, ok in _checks() if not ok]


def check_torchrec() -> None:
    """An ``ImportError`` naming every internal the installed TorchRec lacks, and what to do."""
    missing = _missing()
    if missing:
        raise ImportError(
            f"torchrec_dreamshard cannot use TorchRec {TORCHREC_VERSION} (torch "
            f"{torch.__version__}): it lacks or changed {'; '.join(missing)}. "
            f"Supported: {SUPPORTED_RELEASES}. Install a supported TorchRec with the torch "
            "and fbgemm-gpu it is built for (e.g. pip install 'torchrec>=1.8,<1.10'), or "
            "adapt torchrec_dreamshard/torchrec_compat.py to this release."
        )


check_torchrec()


# -- the planner --------------------------------------------------------------------------


def best_plan(planner: planners.EmbeddingShardingPlanner) -> list[ShardingOption] | None:
    """The sharding options of the plan ``planner`` chose last (``None`` before it planned)."""
    return planner._best_plan


def keep_best_plan(
    planner: planners.EmbeddingShardingPlanner, options: list[ShardingOption]
) -> None:
    """Make ``options`` the plan ``planner`` chose last (the one the verification kept)."""
    planner._best_plan = options


def planner_topology(planner: planners.EmbeddingShardingPlanner) -> Topology:
    """The topology ``planner`` was built with (before any storage reservation)."""
    return planner._topology


def planner_batch_size(planner: planners.EmbeddingShardingPlanner) -> int:
    """The per-rank batch size ``planner`` was built with."""
    return planner._batch_size


def planner_storage_reservation(planner: planners.EmbeddingShardingPlanner) -> StorageReservation:
    """The storage reservation ``planner`` reserves with."""
    return planner._storage_reservation


# -- the storage reservation's dense estimate ----------------------------------------------


def dense_tensor_estimate(
    model: nn.Module, sharders: list[ModuleSharder[nn.Module]], multiplier: float = 6.0
) -> int:
    """What TorchRec's heuristical storage reservation reserves for ``model``'s dense part
    (from shapes and dtypes, so exact on the meta device too)."""
    _, shardable = storage_reservations._get_batch_inputs_and_shardable_parameters(
        model, list(sharders), 1
    )
    return storage_reservations._get_dense_tensor_size(model, shardable, multiplier=multiplier)


def set_dense_tensor_estimate(
    reservation: storage_reservations.HeuristicalStorageReservation, estimate: int
) -> None:
    """Set what ``reservation`` was constructed with as ``dense_tensor_estimate``."""
    reservation._dense_tensor_estimate = estimate


# -- the enumerator -----------------------------------------------------------------------


class HookedEnumerator(EmbeddingEnumerator):
    """TorchRec's ``EmbeddingEnumerator`` with its per-table filter hooks under public names
    (:meth:`filter_sharding_types`, :meth:`filter_compute_kernels`) and an enumeration
    without its search-space cache or deep copy (:meth:`enumerate_uncached`)."""

    _deferred: list[ShardingOption] | None = None

    def filter_sharding_types(
        self, name: str, allowed_sharding_types: list[str], sharder_key: str = ""
    ) -> list[str]:
        """The sharding types table ``name`` is offered (TorchRec's: its constraints)."""
        return EmbeddingEnumerator._filter_sharding_types(
            self, name, allowed_sharding_types, sharder_key
        )

    def filter_compute_kernels(
        self, name: str, allowed_compute_kernels: list[str], sharding_type: str
    ) -> list[str]:
        """The kernels table ``name`` is offered on ``sharding_type`` (TorchRec's)."""
        return EmbeddingEnumerator._filter_compute_kernels(
            self, name, allowed_compute_kernels, sharding_type
        )

    def _filter_sharding_types(
        self, name: str, allowed_sharding_types: list[str], sharder_key: str = ""
    ) -> list[str]:
        return self.filter_sharding_types(name, allowed_sharding_types, sharder_key)

    def _filter_compute_kernels(
        self, name: str, allowed_compute_kernels: list[str], sharding_type: str
    ) -> list[str]:
        return self.filter_compute_kernels(name, allowed_compute_kernels, sharding_type)

    def sharder_for(self, sharder_key: str) -> ModuleSharder[nn.Module] | None:
        """The sharder of the modules named ``sharder_key`` in the enumeration running."""
        return self.sharder_map.get(sharder_key)

    def populate_estimates(self, sharding_options: list[ShardingOption]) -> None:
        """TorchRec's; inside :meth:`enumerate_uncached`, takes the options over."""
        if self._deferred is None:
            super().populate_estimates(sharding_options)
            return
        self._deferred.extend(sharding_options)
        sharding_options.clear()

    def enumerate_uncached(
        self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]]
    ) -> list[ShardingOption]:
        """TorchRec's ``enumerate`` on ``module`` without its search-space cache or deep copy:
        ``populate_estimates`` takes the options over (emptying the list TorchRec copies)
        and they are estimated after it returns."""
        self.forget_search_space()
        self._deferred = []
        try:
            returned = super().enumerate(module, sharders)
        finally:
            taken, self._deferred = self._deferred, None
        options = returned if returned else taken
        self.populate_estimates(options)
        self.forget_search_space()
        return options

    def stored_search_space(
        self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]]
    ) -> list[ShardingOption] | None:
        """The search space kept for this ``module`` (object) and ``sharders``, if any."""
        if self._last_stored_module is module and self._last_stored_sharders == sharders:
            return self._last_stored_search_space
        return None

    def store_search_space(
        self, module: nn.Module, sharders: list[ModuleSharder], options: list[ShardingOption]
    ) -> None:
        """Keep ``options`` as the search space of ``module`` and ``sharders``."""
        self._last_stored_module = module
        self._last_stored_sharders = sharders
        self._last_stored_search_space = options

    def forget_search_space(self) -> None:
        """Drop the kept search space (the next ``enumerate`` enumerates)."""
        self._last_stored_module = None
        self._last_stored_sharders = None
        self._last_stored_search_space = None


# -- a running job ------------------------------------------------------------------------


def dmp_wrapped_module(dmp: model_parallel.DistributedModelParallel) -> nn.Module:
    """The module ``dmp`` runs (its data-parallel wrapper, when it has one)."""
    return dmp._dmp_wrapped_module


def wrap_input_dist(module: ShardedModule, wrap: Callable[[Callable], Callable]) -> None:
    """Replace ``module``'s ``input_dist`` on the instance (not its class) with
    ``wrap(module.input_dist)``; TorchRec calls it through the instance."""
    module.input_dist = wrap(module.input_dist)


def lookup_kernels(module: ShardedModule) -> list[nn.Module]:
    """The kernels of ``module``'s lookups (``_lookups``, ``_emb_modules``; through DDP)."""
    lookups = [getattr(lk, "module", lk) for lk in getattr(module, "_lookups", [])]
    return [k for lookup in lookups for k in getattr(lookup, "_emb_modules", [])]


def pipelined_modules(pipeline: train_pipelines.TrainPipelineSparseDist) -> list[nn.Module]:
    """The sharded modules whose input distribution ``pipeline`` overlaps with compute."""
    return list(pipeline._pipelined_modules)


def apply_optimizer_in_backward(
    optimizer_class: type[torch.optim.Optimizer], params: Any, optimizer_kwargs: dict[str, Any]
) -> None:
    """torch's ``_apply_optimizer_in_backward``, as TorchRec's examples fuse an optimizer."""
    torch_optim._apply_optimizer_in_backward(optimizer_class, params, optimizer_kwargs)


# -- the one workaround of a TorchRec bug ---------------------------------------------------

_TAG_LOCK = threading.Lock()


def torchrec_reshard_tag(*args: Any) -> int:
    """The tag TorchRec gives a reshard's send and recv (``_generate_tag``), as installed."""
    return dynamic_sharding._generate_tag(*args)


def process_independent_tag(
    src_rank: int,
    shard_id: int,
    local_shard_id: int,
    dst_rank: int,
    shard_name: str,
    is_optimizer_state: bool = False,
) -> int:
    """A reshard tag every process computes alike (crc32, in TorchRec's tag range)."""
    key = repr((src_rank, shard_id, local_shard_id, dst_rank, shard_name, is_optimizer_state))
    return zlib.crc32(key.encode()) & dynamic_sharding.MAX_TAG_HASH_VALUE


@contextlib.contextmanager
def process_independent_reshard_tags() -> Iterator[None]:
    """Within the block (under a lock), TorchRec's reshard tags alike on every rank: its
    ``_generate_tag`` is salted per process, so gloo pairs no send with its recv
    (docs/torchrec_compatibility.md#the-reshard-tag-bug)."""
    with _TAG_LOCK:
        original = dynamic_sharding._generate_tag
        dynamic_sharding._generate_tag = process_independent_tag
        try:
            yield
        finally:
            dynamic_sharding._generate_tag = original
