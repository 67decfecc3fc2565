"""Which types each table may take, as TorchRec decides it (the sharder matched to its
collection by module type, less the table's constraints), and so which of the machine's
models the profile step measures for a plan."""

from __future__ import annotations

import dataclasses

import torch
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.sharding_plan import get_default_sharders

from torchrec_dreamshard.evaluation.step_model import StepDLRM
from torchrec_dreamshard.planner.type_choice.model_needs import (
    collections_types,
    offers_priced_types,
)

from harness.step_families import family_spec


def tiny():
    spec = family_spec("tiny", 512)
    return spec, StepDLRM(spec, torch.device("meta")), spec.planner_constraints()


def held_to(constraints: dict, names: list[str], types: list[str]) -> dict:
    held = dict(constraints)
    for name in names:
        held[name] = dataclasses.replace(held[name], sharding_types=types)
    return held


def test_each_table_may_take_its_collections_sharders_types_less_its_constraints():
    spec, model, constraints = tiny()
    first = spec.bags[0].name
    held = held_to(constraints, [first], ["table_wise", "row_wise"])
    sharder = EmbeddingBagCollectionSharder()
    (tables,) = list(collections_types([sharder], model, held, "cpu"))
    allowed = {config.name: types for config, types in tables}
    assert set(allowed) == {b.name for b in spec.bags}
    offered = set(sharder.sharding_types("cpu"))
    assert allowed[first] == offered & {"table_wise", "row_wise"}
    assert all(allowed[b.name] == offered for b in spec.bags[1:])


def test_priced_types_are_offered_only_by_the_sharder_of_the_tables_collection():
    _, model, constraints = tiny()
    assert offers_priced_types(get_default_sharders(), model, constraints, "cpu")
    # a sharder of sequence collections offers data-parallel, but not to pooled tables
    assert "data_parallel" in EmbeddingCollectionSharder().sharding_types("cpu")
    assert not offers_priced_types([EmbeddingCollectionSharder()], model, constraints, "cpu")


def test_tables_held_to_table_wise_need_no_priced_type():
    spec, model, constraints = tiny()
    names = [b.name for b in spec.bags]
    held = held_to(constraints, names, ["table_wise"])
    assert not offers_priced_types(get_default_sharders(), model, held, "cpu")
    one_free = held_to(held, names[-1:], ["table_wise", "data_parallel"])
    assert offers_priced_types(get_default_sharders(), model, one_free, "cpu")
    # row-wise allowed, but on CPU only the sequence collections' sharder offers it
    row_wise = held_to(held, names[-1:], ["table_wise", "row_wise"])
    assert "row_wise" in EmbeddingCollectionSharder().sharding_types("cpu")
    assert "row_wise" not in EmbeddingBagCollectionSharder().sharding_types("cpu")
    assert not offers_priced_types(get_default_sharders(), model, row_wise, "cpu")
