"""Where nothing is spawned: the one rule the planner's collectives and the calibration's
all-to-all head both follow inside a distributed job."""

from __future__ import annotations

import json
import logging

import pytest
from conftest import GLOO_LIKE

from torchrec_dreamshard.cost import collective_models as collectives
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.ranks import spawn


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """An empty cache directory; ``in_job(True)`` makes this process a rank of a job."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(collectives, "_LOADED", {})

    def in_job(value: bool) -> None:
        monkeypatch.setattr(spawn, "in_distributed_job", lambda: value)

    return in_job


def _cache_gloo_like() -> None:
    path = collectives.default_collectives_path("gloo")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(GLOO_LIKE.to_dict()))


def test_only_a_rank_of_a_job_without_a_cached_fit_skips_measuring(private_cache, caplog):
    cache = collectives.default_collectives_path("gloo")
    private_cache(False)
    assert not spawn.skip_measuring(cache, "the fallback")  # measures it (threads, no process)
    private_cache(True)
    with caplog.at_level(logging.INFO, logger="torchrec_dreamshard.ranks.spawn"):
        assert spawn.skip_measuring(cache, "the fallback")
    assert "the fallback: this rank of a running job has no cached fit" in caplog.text
    _cache_gloo_like()
    assert not spawn.skip_measuring(cache, "the fallback")  # reads the cached fit


def test_the_planner_and_the_calibration_decide_alike_inside_a_job(private_cache):
    """Inside a job without its group: analytic collectives and the checkpoint's own
    all-to-all head where nothing is cached; the cached fit where it is."""
    from torchrec_dreamshard.calibration.fine_tuning import _all_to_all_model
    from torchrec_dreamshard.planner.adapters.torchrec_adapter import torchrec_topology
    from torchrec_dreamshard.planner.steps.machine_sources import default_collectives

    load = default_collectives(torchrec_topology(2, "cpu"))
    private_cache(True)
    assert load().backend == "analytic"
    assert _all_to_all_model(MeasureConfig()) is None
    _cache_gloo_like()
    assert load() is GLOO_LIKE  # conftest's planner loader, now that a fit is cached
    assert _all_to_all_model(MeasureConfig()) == GLOO_LIKE.models["all_to_all"]
