"""Checkpoints: round trip, and clear errors (never code execution) on bad files."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from torchrec_dreamshard.data.families import TRAIN_FAMILIES
from torchrec_dreamshard.data.sampler import TaskSampler
from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool
from torchrec_dreamshard.policy import DreamShard, PolicyNet, policy_net
from torchrec_dreamshard.policy.checkpoint import (
    BUNDLED_CHECKPOINT,
    load_checkpoint,
    read_payload,
    save_checkpoint,
)


@pytest.fixture(scope="module")
def task():
    return TaskSampler(synthetic_pool(100, scale=CPU_POOL_SCALE), seed=3).sample("test", 20, 4)


@pytest.fixture()
def saved(tmp_path):
    agent = DreamShard.untrained(seed=11)
    path = tmp_path / "agent.pt"
    save_checkpoint(agent, path, extra={"iteration": 3})
    return agent, path


def test_round_trip_predicts_the_same(saved, task):
    agent, path = saved
    loaded = load_checkpoint(path)
    placement = agent.place(task)
    assert loaded.place(task) == placement
    assert loaded.predict(task, placement) == agent.predict(task, placement)
    assert read_payload(path)["extra"]["iteration"] == 3
    assert loaded.meta["features"]["dim"] == 21


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt")


def test_truncated_file(saved):
    _, path = saved
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="could not be read safely"):
        load_checkpoint(path)


def test_corrupt_file(tmp_path):
    path = tmp_path / "junk.pt"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(ValueError, match="could not be read safely"):
        load_checkpoint(path)


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {_Evil.marker}",))


def test_pickled_code_is_never_run(tmp_path):
    marker = tmp_path / "pwned"
    _Evil.marker = str(marker)
    path = tmp_path / "evil.pt"
    torch.save({"format": "torchrec-dreamshard", "payload": _Evil()}, path)
    with pytest.raises(ValueError, match="could not be read safely"):
        load_checkpoint(path)
    plain = tmp_path / "evil.pkl"
    plain.write_bytes(pickle.dumps(_Evil()))
    with pytest.raises(ValueError):
        load_checkpoint(plain)
    assert not marker.exists()


def test_other_format(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, path)
    with pytest.raises(ValueError, match="not a torchrec-dreamshard checkpoint"):
        load_checkpoint(path)


def _rewrite(path: Path, edit) -> None:
    payload = torch.load(path, weights_only=True)
    edit(payload)
    torch.save(payload, path)


def test_mismatched_features(saved):
    _, path = saved
    _rewrite(path, lambda p: p["meta"]["features"]["scales"].update(dim_log2=9.0))
    with pytest.raises(ValueError, match="feature normalisation"):
        load_checkpoint(path)


def test_mismatched_weights(saved):
    _, path = saved
    _rewrite(path, lambda p: p["meta"].update(hidden=32))
    with pytest.raises(ValueError, match="weights do not fit"):
        load_checkpoint(path)


def test_wrong_version(saved):
    _, path = saved
    _rewrite(path, lambda p: p.update(format_version=99))
    with pytest.raises(ValueError, match="format version"):
        load_checkpoint(path)


def test_non_finite_weights(saved):
    _, path = saved
    _rewrite(path, lambda p: p["policy"]["body.0.weight"].fill_(float("nan")))
    with pytest.raises(ValueError, match="non-finite"):
        load_checkpoint(path)


def test_bundled_checkpoint_loads(task):
    assert BUNDLED_CHECKPOINT.is_file(), "the package must ship its trained checkpoint"
    agent = load_checkpoint()
    assert agent.meta["trained"] is True
    assert agent.meta["workload"]["optimizer"] == "rowwise_adagrad"
    assert set(agent.meta["train_families"]) == set(TRAIN_FAMILIES)  # none held out
    assert "hardware" in agent.meta and "workload" in agent.meta and "version" in agent.meta
    placement = agent.place(task)
    assert agent.predict(task, placement).step_ms > 0


# -- the networks a checkpoint names --------------------------------------------------------


class UniformPolicy(torch.nn.Module):
    """A policy network of another architecture: equal logits and one learnable bias."""

    CONFIG_LIMITS = {"uniform_width": 8}

    def __init__(self, in_dim: int, width: int) -> None:
        super().__init__()
        self.in_dim, self.width = in_dim, width
        self.bias = torch.nn.Parameter(torch.zeros(width))

    @classmethod
    def from_config(cls, config, in_dim: int) -> UniformPolicy:
        return cls(in_dim, config["uniform_width"])

    def config(self) -> dict:
        return {"uniform_width": self.width}

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return u[..., 0] * 0.0 + self.bias.sum()


@pytest.fixture
def uniform_registered(monkeypatch):
    """``UniformPolicy`` registered as ``"uniform"`` for the test only."""
    monkeypatch.setattr(policy_net, "POLICY_NETWORKS", dict(policy_net.POLICY_NETWORKS))
    return policy_net.register_policy("uniform")(UniformPolicy)


def test_a_policy_network_is_one_class_and_one_registration(uniform_registered, task, tmp_path):
    net, _ = policy_net.build_networks({"hidden": 4, "members": 2, "policy_hidden": 8})
    agent = DreamShard(net, uniform_registered(net.enc_dim, 3))
    path = tmp_path / "uniform.pt"
    save_checkpoint(agent, path)
    meta = read_payload(path)["meta"]
    assert (meta["policy_architecture"], meta["uniform_width"]) == ("uniform", 3)
    loaded = load_checkpoint(path)
    assert type(loaded.policy) is UniformPolicy and loaded.policy.width == 3
    assert loaded.place(task, mode="greedy") == agent.place(task, mode="greedy")
    _rewrite(path, lambda p: p["meta"].update(uniform_width=9))
    with pytest.raises(ValueError, match="'uniform_width' must be an integer in 1..8"):
        load_checkpoint(path)


def test_an_unknown_policy_network_is_named_with_the_known_ones(saved):
    _, path = saved
    _rewrite(path, lambda p: p["meta"].update(policy_architecture="transformer"))
    with pytest.raises(ValueError, match=r"'transformer' is not .*known: \['prior_mlp'\]"):
        load_checkpoint(path)


def test_a_name_is_registered_once(uniform_registered):
    with pytest.raises(ValueError, match="already registered"):
        policy_net.register_policy("uniform")(UniformPolicy)


def test_a_checkpoint_naming_no_policy_network_holds_the_first_one():
    """The bundled checkpoint predates the name: it loads as it did, the default network
    with its recorded sizes, and new checkpoints name theirs."""
    meta = read_payload()["meta"]
    assert "policy_architecture" not in meta
    agent = load_checkpoint()
    assert type(agent.policy) is PolicyNet and agent.policy.hidden == meta["policy_hidden"]
    assert agent.meta == meta
