"""The benchmarks' user path (``harness.user_planning``): the planner built as ``dreamshard
plan`` builds it with no flags, an empty cache per plan, loose and two-rank memories, and
whole-table placements read off a plan."""

from __future__ import annotations

import os

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task

from harness.user_planning import (
    LOOSE_FACTOR,
    cli_arguments,
    fresh_cache,
    loose_task,
    two_rank_task,
    whole_placement,
)


def _task() -> Task:
    tables = [
        TableSpec(name=f"t{i}", rows=1000 * (i + 1), dim=16, pooling_factor=2.0) for i in range(4)
    ]
    total = sum(t.size_bytes for t in tables)
    return Task(tables=tables, num_devices=4, memory_bytes=total // 2, batch_size=64)


def test_the_arguments_are_the_commands_defaults():
    args, tw = cli_arguments(), cli_arguments(no_splits=True)
    assert not args.no_splits and tw.no_splits
    assert args.timeout is None and args.verify is None and args.calibrate is None
    assert args.mode == "safe" and args.cache_dir is None and args.profile is None


def test_a_fresh_cache_is_an_empty_xdg_cache_home_restored_after(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("DREAMSHARD_CALIBRATION_STORE", str(tmp_path / "x.sqlite"))
    with fresh_cache() as home:
        assert os.environ["XDG_CACHE_HOME"] == str(home) != str(tmp_path)
        assert "DREAMSHARD_CALIBRATION_STORE" not in os.environ
        assert not any(home.iterdir())
    assert os.environ["XDG_CACHE_HOME"] == str(tmp_path)
    assert os.environ["DREAMSHARD_CALIBRATION_STORE"] == str(tmp_path / "x.sqlite")
    assert not home.exists()


def test_loose_memory_bounds_no_placement_and_two_ranks_keep_the_total():
    task = _task()
    total = sum(t.size_bytes for t in task.tables)
    loose = loose_task(task)
    assert min(loose.memory) >= LOOSE_FACTOR * max(t.size_bytes for t in task.tables)
    assert sum(loose.memory) >= LOOSE_FACTOR * total
    two = two_rank_task(task)
    assert two.num_devices == 2 and sum(two.memory) == sum(task.memory)


def test_a_whole_placement_only_where_every_table_is_table_wise_on_one_rank():
    task = _task()
    tw = {f"t{i}": {"sharding_type": "table_wise", "ranks": [i % 2]} for i in range(4)}
    assert whole_placement(task, tw) == [0, 1, 0, 1]
    dp = dict(tw, t2={"sharding_type": "data_parallel", "ranks": [0, 1]})
    assert whole_placement(task, dp) is None
    assert whole_placement(task, {k: v for k, v in tw.items() if k != "t3"}) is None
