"""Fixtures the test modules share."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from torchrec_dreamshard.cost.collective_models import CollectiveModels
from torchrec_dreamshard.cost.comm_model import CommModel
from torchrec_dreamshard.cost.dense_kernel_model import DenseKernelModel
from torchrec_dreamshard.measure.collective_timing import COLLECTIVES


@pytest.fixture(autouse=True, scope="session")
def no_user_cache(tmp_path_factory) -> Iterator[None]:
    """Fixtures wider than one test (module- and session-scoped) run before a test's own
    cache is set (:func:`cold_cache`): they see an empty session directory as
    ``XDG_CACHE_HOME`` and no calibration store named in the environment, so nothing the
    test run does reads or writes the user's cache. Matplotlib's font list, which it
    would otherwise rebuild under each test's ``XDG_CACHE_HOME``, is kept once for the
    run (``MPLCONFIGDIR``): it is not ours and no test measures it."""
    from torchrec_dreamshard.cache.store_keys import STORE_ENV

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("session_cache")))
        patch.setenv("MPLCONFIGDIR", str(tmp_path_factory.mktemp("matplotlib")))
        patch.delenv(STORE_ENV, raising=False)
        yield


@pytest.fixture(autouse=True)
def cold_cache(tmp_path, monkeypatch) -> Path:
    """Every test starts as a new user's machine does: its own empty cache directory
    (``XDG_CACHE_HOME`` under ``tmp_path``, inherited by spawned and launched ranks) and no
    calibration store named in the environment (so the store is the default one, in that
    directory). What a test measures or caches is its own: whether it takes the cold or the
    warm path does not depend on which tests ran before it, and it gives the same result
    alone as in the full run. Returns the directory (not created)."""
    from torchrec_dreamshard.cache.store_keys import STORE_ENV

    cache = tmp_path / "xdg_cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv(STORE_ENV, raising=False)
    return cache


@pytest.fixture
def comm_model(cold_cache, monkeypatch) -> Iterator[CommModel]:
    """The fixed collective and dense-kernel models of :func:`fixed_collectives` and the
    bundled network's own reference-kernel time written in the test's own cache directory
    (:func:`cold_cache`, inherited by spawned processes); yields the all-to-all model every
    caller charges (:data:`GLOO_LIKE`'s). No test calibrates gloo's collectives or times
    those kernels, in this process or in the ranks it spawns, nor reads or writes the
    user's cache."""
    from torchrec_dreamshard.cache import reference_time
    from torchrec_dreamshard.cache.machine_cache import write_cached_data
    from torchrec_dreamshard.cost import collective_models as collectives
    from torchrec_dreamshard.cost import dense_kernel_model

    monkeypatch.setattr(collectives, "_LOADED", {})
    fwd, bwd = bundled_reference_ms()
    record = {"version": reference_time.FORMAT_VERSION, "fwd_ms": fwd, "bwd_ms": bwd}
    for file, value in [
        (collectives.collectives_cache_file("gloo"), GLOO_LIKE.to_dict()),
        (dense_kernel_model.dense_kernel_cache_file(), CPU_DENSE_LIKE.to_dict()),
        (reference_time.reference_cache_file(), record),
    ]:
        write_cached_data(file, value, "test fixture")  # keyed as this machine's
    yield GLOO_LIKE.models["all_to_all"]


_BUNDLED_REFERENCE: list[tuple[float, float]] = []


def bundled_reference_ms() -> tuple[float, float]:
    """The bundled network's prediction of the reference kernel (so that a spawned
    planner scales its kernels by 1), computed once."""
    if not _BUNDLED_REFERENCE:
        from torchrec_dreamshard.cost.plans import cost_network_kernel
        from torchrec_dreamshard.measure.embedding_kernels import (
            REFERENCE_BATCH_SIZE,
            REFERENCE_TABLES,
        )
        from torchrec_dreamshard.policy.checkpoint import load_checkpoint

        kernel = cost_network_kernel(load_checkpoint(None))
        _BUNDLED_REFERENCE.append(kernel(list(REFERENCE_TABLES), REFERENCE_BATCH_SIZE))
    return _BUNDLED_REFERENCE[0]


@pytest.fixture
def quiet() -> Iterator[None]:
    """Warnings silenced for the test (TorchRec's planner warns about topologies and
    storage reservations on every plan); a module takes it with
    ``pytestmark = pytest.mark.usefixtures("quiet")``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.fixture(scope="module")
def agent():
    """An untrained agent (seed 0): what planner tests place with when the plan's quality
    is not what they test. A module that needs another agent defines its own ``agent``."""
    from torchrec_dreamshard.policy import DreamShard

    return DreamShard.untrained(seed=0)


@pytest.fixture
def run_cli() -> Callable[[Sequence[str]], int]:
    """``run_cli(argv)``: the ``dreamshard`` entry point's exit code, warnings silenced."""
    from torchrec_dreamshard.cli import main

    def run(argv: Sequence[str]) -> int:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return main(list(argv))

    return run


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


# A dense-kernel model of the order this machine's fit gave (ms; per table, per MB gathered,
# written and of weights): fixed for the same reason. tests/test_dense_kernels.py fits the
# real one.
CPU_DENSE_LIKE = DenseKernelModel(
    fwd=(0.05, 0.003, 0.0, 0.22, 0.016),
    bwd=(0.11, 0.002, 0.003, 0.41, 0.95),
    source="tests: a fixed CPU-like dense kernel",
)


@pytest.fixture(autouse=True, scope="session")
def fixed_collectives() -> Iterator[CollectiveModels]:
    """The planner's CPU collective models are :data:`GLOO_LIKE`, its dense-kernel model
    :data:`CPU_DENSE_LIKE`, its sharding path uncharged and its reference kernel
    unmeasured in every test (so the default, automatic calibration plans with the
    checkpoint as it is): none calibrates gloo's collectives (20 s), times a kernel or
    spawns ranks to time the sharding path for the planner, and no plan depends on the
    machine or its load (tests/test_sharding_path.py charges a fixed path cost). Ranks a
    test spawns or launches do not inherit this; they pass what they pin, or measure what
    they assert."""
    from torchrec_dreamshard.calibration import auto
    from torchrec_dreamshard.planner.steps import machine_sources

    with pytest.MonkeyPatch.context() as patch:
        # `dreamshard plan`'s automatic calibration plans with the checkpoint as it is
        patch.setattr(auto, "measured_reference_ms", lambda device="cpu": None)
        patch.setattr(machine_sources, "load_collective_models", lambda **kw: GLOO_LIKE)
        patch.setattr(machine_sources, "load_dense_kernel_model", lambda **kw: CPU_DENSE_LIKE)
        patch.setattr(machine_sources, "load_sharding_path_model", lambda **kw: None)
        # the cost network's kernels as predicted (tests/test_reference_speed.py scales them)
        patch.setattr(machine_sources, "load_reference_ms", lambda **kw: None)
        yield GLOO_LIKE


class FakeClock:
    """A clock the test moves itself: ``clock()`` reads it (seconds), ``clock.advance(s)``
    moves it on. Code under test that takes a clock (``spending(clock=...)``, a
    verification ``Timing``'s ``clock``, a ``StepSampler``'s ``clock``) then decides the
    same on a loaded CI core as on an idle one, and no test asserts how fast anything ran
    (timings are ``benchmarks/``' job)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock does not go back: advance({seconds})")
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    """A :class:`FakeClock` at 1000 s."""
    return FakeClock()
