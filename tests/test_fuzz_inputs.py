"""Property-based fuzzing of what users hand us: task JSON and checkpoint metadata.

Any JSON document gives a ``Task`` or a ``ValueError`` that names what was wrong, never
another exception; any checkpoint metadata gives an agent or a ``ValueError`` naming the
file, before a network is built.
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.io import loads_strict
from torchrec_dreamshard.policy import DreamShard
from torchrec_dreamshard.policy.checkpoint import load_checkpoint, read_payload, save_checkpoint

# Words at least one of which names the culprit in every message.
FIELDS = ("task", "table", "num_devices", "memory_bytes", "batch_size", "tables", "name")
FIELDS += ("rows", "dim", "pooling_factor", "reuse_hist", "bytes_per_element", "device")
FIELDS += ("bag_length_cv",)

numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers(min_value=-3, max_value=70_000),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 1, 2, 4, 0.5, 1e308, 10**400, 2.0, 1e-300]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=8))
json_values = st.recursive(
    scalars,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4)
    ),
    max_leaves=12,
)


def _table(draw_hist):
    return st.fixed_dictionaries(
        {"name": st.one_of(st.text(min_size=0, max_size=5), scalars)},
        optional={
            "rows": st.one_of(numbers, scalars),
            "dim": st.one_of(numbers, scalars),
            "pooling_factor": st.one_of(numbers, scalars),
            "reuse_hist": draw_hist,
            "bytes_per_element": st.one_of(numbers, scalars),
            "bag_length_cv": st.one_of(numbers, scalars),
            "extra": scalars,
        },
    )


hists = st.one_of(
    json_values,
    st.lists(st.one_of(numbers, st.booleans()), min_size=17, max_size=17),
    st.just([1.0] + [0.0] * 16),
)
tasks = st.fixed_dictionaries(
    {},
    optional={
        "num_devices": st.one_of(numbers, scalars),
        "memory_bytes": st.one_of(numbers, st.lists(numbers, max_size=5), scalars),
        "batch_size": st.one_of(numbers, scalars),
        "tables": st.one_of(st.lists(_table(hists), max_size=4), json_values),
        "other": scalars,
    },
)


def _check(doc) -> None:
    try:
        task = Task.from_dict(doc)
    except ValueError as exc:
        message = str(exc)
        assert message and "\n" not in message
        assert any(word in message for word in FIELDS), message
    else:
        assert isinstance(task, Task)
        assert 1 <= task.num_devices <= 4096
        json.dumps(task.to_dict(), allow_nan=False)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tasks)
def test_task_dicts_parse_or_name_the_field(doc):
    _check(doc)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_any_json_value_parses_or_names_the_field(doc):
    _check(doc)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60))
def test_any_text_is_json_or_a_value_error(text):
    try:
        doc = loads_strict(text)
    except ValueError:
        return
    _check(doc)


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"a": 1, "a": 2}', "duplicate key 'a'"),
        ('{"a": NaN}', "NaN is not a JSON number"),
        ("[" * 100_000 + "]" * 100_000, "nested more than"),
        ("1" * 5000, "Exceeds the limit"),
    ],
)
def test_strict_json_refusals(text, message):
    with pytest.raises(ValueError, match=message):
        loads_strict(text)


# -- checkpoint metadata ---------------------------------------------------------------


@pytest.fixture(scope="module")
def payload(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "agent.pt"
    save_checkpoint(DreamShard.untrained(seed=0, hidden=8), path)
    return read_payload(path)


metas = st.fixed_dictionaries(
    {},
    optional={
        "hidden": st.one_of(scalars, st.sampled_from([8, 10**9, True, 0, -1, 8.0])),
        "batch_size": st.one_of(scalars, st.sampled_from([0, 2048, True, 10**18])),
        "hardware": json_values,
        "workload": json_values,
        "version": json_values,
    },
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(meta=metas)
def test_checkpoint_meta_is_checked_before_building(payload, meta, tmp_path):
    changed = dict(payload, meta={**payload["meta"], **meta})
    path = tmp_path / "fuzz.pt"
    torch.save(changed, path)
    try:
        agent = load_checkpoint(path)
    except ValueError as exc:
        assert str(path) in str(exc)
    else:
        assert agent.cost_net.hidden == 8


def test_checkpoint_huge_hidden_is_refused_without_building(payload, tmp_path):
    path = tmp_path / "huge.pt"
    torch.save(dict(payload, meta={**payload["meta"], "hidden": 4096}), path)
    with pytest.raises(ValueError, match="has shape"):
        load_checkpoint(path)


def test_checkpoint_directory_is_not_missing(tmp_path):
    with pytest.raises(ValueError, match="is a directory"):
        load_checkpoint(tmp_path)
