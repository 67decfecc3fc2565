"""``PolicyPlacer`` and the partitioner around it: only a placement that does not fit
becomes TorchRec's storage error (which TorchRec's loop takes as a proposal that does not
partition); any other error of placing reaches the caller of ``plan`` as itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.types import (
    ParameterConstraints,
    PlannerError,
    PlannerErrorType,
    Topology,
)
from torchrec.models.dlrm import DLRM
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import InsufficientMemoryError, NoPlanError, Task
from torchrec_dreamshard.planner import DreamShardPlanner
from torchrec_dreamshard.planner.stages.placement import PolicyPlacer
from torchrec_dreamshard.policy import DreamShard, PlacementError, PlaceSettings
from torchrec_dreamshard.policy.split_search import plan_with_splits

pytestmark = pytest.mark.usefixtures("quiet")

GREEDY = PlaceSettings(mode="greedy")


class NumpyBugAgent(DreamShard):
    """A user's agent with a bug of its own: its placement adds arrays of two lengths,
    and numpy raises its ``ValueError`` ("operands could not be broadcast together")."""

    def place(self, task: Task, *args, **kwargs) -> list[int]:
        sizes = np.asarray([t.size_bytes for t in task.tables])
        return list(sizes + np.zeros(len(sizes) + 1))


def specs(n: int, rows: int = 1000, dim: int = 16) -> list[TableSpec]:
    """``n`` tables of ``rows * dim * 4`` bytes (64 kB by default)."""
    return [TableSpec(name=f"t{i}", rows=rows, dim=dim, pooling_factor=1.0) for i in range(n)]


def test_does_not_fit_is_one_error_and_a_no_plan_error():
    """Every "does not fit" of placing is an ``InsufficientMemoryError``: the task's own
    check, the policy's roll-out (``PlacementError``); callers that catch ``NoPlanError``
    or ``ValueError`` still do. Other bad input stays a plain ``ValueError``."""
    assert issubclass(PlacementError, InsufficientMemoryError)
    assert issubclass(InsufficientMemoryError, NoPlanError)
    with pytest.raises(InsufficientMemoryError, match=r"tables \['t0'\] are bigger"):
        Task(tables=specs(1), num_devices=2, memory_bytes=1000, batch_size=8)
    with pytest.raises(InsufficientMemoryError, match="192000 bytes but the 2 devices"):
        Task(tables=specs(3), num_devices=2, memory_bytes=90_000, batch_size=8)
    with pytest.raises(ValueError, match="duplicate table names") as err:
        Task(tables=specs(1) + specs(1), num_devices=2, memory_bytes=10**6, batch_size=8)
    assert not isinstance(err.value, InsufficientMemoryError)


def test_a_placement_that_does_not_fit_is_torchrecs_storage_error():
    """Three 64 kB tables, two devices of 100 kB: the bytes fit in all and each table fits
    a device, but no packing does. The policy's roll-out finds no device with room for the
    third: TorchRec's ``INSUFFICIENT_STORAGE``, DreamShard's message, the cause kept."""
    placer = PolicyPlacer(DreamShard.untrained(seed=0), 64, GREEDY)
    with pytest.raises(PlannerError, match="DreamShard could not place the tables") as err:
        placer.place(specs(3), [100_000, 100_000], {})
    assert err.value.error_type == PlannerErrorType.INSUFFICIENT_STORAGE
    assert isinstance(err.value.__cause__, PlacementError)
    assert "fits" in str(err.value) or "room" in str(err.value)


def test_another_error_of_placing_raises_as_itself():
    placer = PolicyPlacer(NumpyBugAgent.untrained(seed=0), 64, GREEDY)
    with pytest.raises(ValueError, match="could not be broadcast together") as err:
        placer.place(specs(3), [10**6, 10**6], {})
    assert not isinstance(err.value, InsufficientMemoryError)


def test_the_split_search_retries_only_what_does_not_fit(monkeypatch):
    """The split search splits further while the agent's placement does not fit; an agent
    that fails otherwise fails the search at once, as itself (before, it was retried and
    reported as "no placement fits")."""
    calls = []

    class Bug(DreamShard):
        def place(self, task, *args, **kwargs):
            calls.append(len(task.tables))
            raise ValueError("placement has 2 entries for 3 tables")

    task = Task(tables=specs(3), num_devices=2, memory_bytes=10**6, batch_size=8)
    with pytest.raises(ValueError, match="placement has 2 entries") as err:
        plan_with_splits(Bug.untrained(seed=0), task, GREEDY)
    assert calls == [3] and not isinstance(err.value, InsufficientMemoryError)


# -- through the planner ------------------------------------------------------------------

META = torch.device("meta")
SHARDERS = [EmbeddingBagCollectionSharder()]


def model(rows: int = 1000, n: int = 4) -> DLRM:
    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=16, num_embeddings=rows, feature_names=[f"f{i}"]
        )
        for i in range(n)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=META)
    return DLRM(
        embedding_bag_collection=ebc,
        dense_in_features=4,
        dense_arch_layer_sizes=[8, 16],
        over_arch_layer_sizes=[8, 1],
        dense_device=META,
    )


def planner(agent, n: int = 4, **topology) -> DreamShardPlanner:
    """Every table table-wise, placed by ``agent``; nothing calibrated or verified."""
    table_wise = ParameterConstraints(sharding_types=["table_wise"])
    return DreamShardPlanner(
        topology=Topology(world_size=2, compute_device="cpu", **topology),
        batch_size=8,
        agent=agent,
        constraints={f"t{i}": table_wise for i in range(n)},
        calibrate=False,
        verify=0,
    )


def test_a_numpy_error_in_placement_reaches_the_caller_of_plan(comm_model):
    """Before, TorchRec's loop skipped the proposal as one that did not fit and the user
    read "insufficient storage"; now ``plan`` raises numpy's error with its message."""
    with pytest.raises(ValueError, match="could not be broadcast together") as err:
        planner(NumpyBugAgent.untrained(seed=0)).plan(model(), SHARDERS)
    assert not isinstance(err.value, PlannerError)


def test_an_error_injected_where_the_placer_places_reaches_the_caller(comm_model, monkeypatch):
    """A ``ValueError`` raised inside ``PolicyPlacer.place`` (here by the shard task it
    builds) is not a placement that does not fit."""
    from torchrec_dreamshard.planner.stages import placement

    def broken(task, columns):
        raise ValueError("zip() argument 2 is shorter than argument 1")

    monkeypatch.setattr(placement, "shard_task", broken)
    with pytest.raises(ValueError, match=r"zip\(\) argument 2 is shorter"):
        planner(DreamShard.untrained(seed=0)).plan(model(), SHARDERS)


def test_a_model_that_does_not_pack_is_still_torchrecs_storage_error(comm_model):
    """Three tables of 65 kB (TorchRec's storage estimate), two devices of 112 kB each
    after TorchRec's reservation: the partitioner's totals pass (195 of 224 kB) and each
    table fits a device, but no packing does. The policy finds no device with room for the
    third table; TorchRec's loop skips the proposal and ends in its own ``PlannerError``
    with DreamShard's message (of the strict-constraints type: by TorchRec's totals the
    storage would suffice). With 147 kB a device, the same model plans."""
    with pytest.raises(PlannerError) as err:
        planner(DreamShard.untrained(seed=0), n=3, ddr_cap=125_000).plan(model(n=3), SHARDERS)
    assert err.value.error_type in (
        PlannerErrorType.STRICT_CONSTRAINTS,
        PlannerErrorType.INSUFFICIENT_STORAGE,
    )
    text = str(err.value)
    assert "Unable to find a plan for this model" in text  # TorchRec's loop's own error
    assert "DreamShard could not place the tables" in text and "fits on no device" in text
    planner(DreamShard.untrained(seed=0), n=3, ddr_cap=160_000).plan(model(n=3), SHARDERS)
