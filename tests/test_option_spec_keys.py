"""The declared reuse histograms and bag-length cvs are keyed as TorchRec's
``constraints`` are, by table name, or by fully qualified name; a key naming no table, or a
name two tables share, is refused naming it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from torchrec_dreamshard.planner.stages.option_specs import OptionSpecs

HIST = (0.5, 0.5) + (0.0,) * 15


def collection(*names: str) -> EmbeddingBagCollection:
    configs = [
        EmbeddingBagConfig(name=n, num_embeddings=64, embedding_dim=8, feature_names=[f"f_{n}"])
        for n in names
    ]
    return EmbeddingBagCollection(tables=configs, device=torch.device("meta"))


class TwoCollections(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.user = collection("t0", "shared")
        self.item = collection("t1", "shared")


def test_a_table_name_is_read_as_its_fully_qualified_name():
    specs = OptionSpecs(declared={"t0": HIST}, declared_cvs={"t1": 1.5})
    specs.observe(TwoCollections())
    assert specs.reuse == {"user.t0": HIST}
    assert specs.bag_length_cvs == {"item.t1": 1.5}


def test_a_fully_qualified_name_is_read_as_it_is():
    specs = OptionSpecs(declared={"user.shared": HIST})
    specs.observe(TwoCollections())
    assert specs.reuse == {"user.shared": HIST}
    root = OptionSpecs(declared_cvs={".t0": 2.0, "t1": 1.0})
    root.observe(collection("t0", "t1"))  # the collection is the model: ".t0"
    assert root.bag_length_cvs == {".t0": 2.0, ".t1": 1.0}


def test_an_unknown_key_is_refused_naming_it():
    specs = OptionSpecs(declared={"t9": HIST})
    with pytest.raises(ValueError, match=r"reuse_hists names 't9', which is no table.*user\.t0"):
        specs.observe(TwoCollections())
    cvs = OptionSpecs(declared_cvs={"user.t9": 1.0})
    with pytest.raises(ValueError, match=r"bag_length_cvs names 'user\.t9'"):
        cvs.observe(TwoCollections())


def test_a_name_two_tables_share_asks_for_the_fully_qualified_name():
    specs = OptionSpecs(declared_cvs={"shared": 1.0})
    with pytest.raises(ValueError, match=r"'shared'.*\['item\.shared', 'user\.shared'\]"):
        specs.observe(TwoCollections())


def test_the_planner_takes_table_names_as_its_constraints_do():
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.sharding_plan import get_default_sharders

    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.planner.adapters.topology import torchrec_topology

    planner = DreamShardPlanner(
        topology=torchrec_topology(2, "cpu"),
        batch_size=64,
        constraints={"t0": ParameterConstraints(pooling_factors=[2.0])},
        reuse_hists={"t0": HIST},
        bag_length_cvs={"t1": 1.5},
        measure=False,
    )
    planner.plan(collection("t0", "t1"), get_default_sharders())
    assert planner.table_specs.reuse[".t0"] == HIST
    assert planner.table_specs.bag_length_cvs == {".t1": 1.5}
