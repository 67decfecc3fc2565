"""Fixtures every test module shares."""

from __future__ import annotations

import pytest

from torchrec_dreamshard.measure import collectives as collectives_mod
from torchrec_dreamshard.measure.collectives import COLLECTIVES, CollectiveModels
from torchrec_dreamshard.measure.comm import CommModel

# gloo-like collective models (ms per peer, ms per MB: the order of what this machine's
# fits gave): fixed, so the sharding-type choice of the planner tests does not depend on
# the machine or its load. tests/test_collectives.py measures the real ones.
GLOO_LIKE = CollectiveModels(
    backend="gloo",
    models={
        kind: CommModel(latency_ms=0.0, per_peer_ms=peer, ms_per_mb=per_mb, source="tests")
        for kind, (peer, per_mb) in zip(
            COLLECTIVES, [(0.8, 0.5), (2.9, 1.7), (1.9, 1.1), (2.5, 0.8)], strict=True
        )
    },
    source="tests: fixed gloo-like models",
)


@pytest.fixture(autouse=True, scope="session")
def fixed_collectives():
    """The planner's default CPU collective models, for every test (no calibration)."""
    path = str(collectives_mod.default_collectives_path("gloo"))
    before = collectives_mod._LOADED.get(path)
    collectives_mod._LOADED[path] = GLOO_LIKE
    yield GLOO_LIKE
    if before is None:
        collectives_mod._LOADED.pop(path, None)
    else:
        collectives_mod._LOADED[path] = before
