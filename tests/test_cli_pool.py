"""``dreamshard pool`` through its entry point."""

from __future__ import annotations

import json

from torchrec_dreamshard.cli import main
from torchrec_dreamshard.data.sampler import TaskSampler
from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool
from torchrec_dreamshard.data.tasks import Task


def test_pool_summary_describes_the_pool(capsys):
    assert main(["pool", "--summary", "--seed", "2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    pool = synthetic_pool(scale=CPU_POOL_SCALE, seed=2)
    assert summary["tables"] == len(pool) == 856 and summary["scale"] == CPU_POOL_SCALE
    assert summary["rows_min"] == min(t.rows for t in pool)
    assert summary["dims"] == [4, 8, 16, 32, 64, 128, 256]
    assert len(summary["access_share"]) == 17
    assert abs(sum(summary["access_share"]) - 1.0) < 1e-3


def test_pool_writes_the_sampled_task(tmp_path, capsys):
    out = tmp_path / "task.json"
    argv = ["pool", "--sample-task", str(out), "--num-tables", "12", "--num-devices", "3"]
    assert main([*argv, "--seed", "4", "--split", "train"]) == 0
    assert "12 tables on 3 devices" in capsys.readouterr().out
    task = Task.load(out)
    sampler = TaskSampler(synthetic_pool(scale=CPU_POOL_SCALE, seed=4), seed=4)
    expected = sampler.sample("train", 12, 3, batch_size=2048)
    assert task.names == expected.names and task.memory == expected.memory
    assert task.to_dict() == Task.from_dict(expected.to_dict()).to_dict()  # JSON round trip
