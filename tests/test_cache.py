"""The planner's cache: where it lives (a scoped ``cache_dir`` override before
``$XDG_CACHE_HOME``), what a cached measurement is keyed by, and ``dreamshard cache``."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest
import torch

from torchrec_dreamshard.cache import reference_time as rt
from torchrec_dreamshard.cache.inventory import KINDS
from torchrec_dreamshard.cache.location import cache_root, using_cache_dir
from torchrec_dreamshard.cache.machine_cache import forget_loaded, measurement_key
from torchrec_dreamshard.cache.store_keys import STORE_ENV, default_store_path
from torchrec_dreamshard.cli.cache import EXAMPLES
from torchrec_dreamshard.cost import collective_models
from torchrec_dreamshard.measure import hardware
from torchrec_dreamshard.measure import reference_speed as rs
from torchrec_dreamshard.measure.config import stable_key
from torchrec_dreamshard.threads import single_thread


@pytest.fixture(autouse=True)
def nothing_remembered():
    """No value a test loaded is remembered for the next."""
    forget_loaded()
    yield
    forget_loaded()


def fake_reference(monkeypatch, calls: list[int], ms=(2.0, 20.0)) -> None:
    """The reference kernel 'measured' as ``ms``, each measurement counted in ``calls``."""
    monkeypatch.setattr(rs, "measure_reference_ms", lambda device: calls.append(1) or ms)


# ----------------------------------------------------------------------------------------
# Where the cache is
# ----------------------------------------------------------------------------------------


def test_the_override_holds_inside_its_block_only(cold_cache, tmp_path, monkeypatch):
    """Outside any block: $XDG_CACHE_HOME/torchrec_dreamshard, and the store the
    environment names; inside: the block's directory for every cache, the store included;
    nested blocks restore the outer one, and an exception leaves no override behind."""
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "named.sqlite"))
    assert cache_root() == cold_cache / "torchrec_dreamshard"
    assert default_store_path() == tmp_path / "named.sqlite"
    with using_cache_dir(tmp_path / "a") as a:
        assert cache_root() == a == tmp_path / "a"
        assert default_store_path() == tmp_path / "a" / "calibration.sqlite"
        assert rt.default_reference_path().parent == a
        assert collective_models.default_collectives_path("gloo").parent == a
        with using_cache_dir(tmp_path / "b"):
            assert cache_root() == tmp_path / "b"
        with using_cache_dir(None):  # no cache_dir given: the enclosing one stays
            assert cache_root() == a
        assert cache_root() == a
    with pytest.raises(RuntimeError), using_cache_dir(tmp_path / "c"):
        raise RuntimeError("planning failed")
    assert cache_root() == cold_cache / "torchrec_dreamshard"
    assert default_store_path() == tmp_path / "named.sqlite"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == Path.home() / ".cache" / "torchrec_dreamshard"


def test_the_override_is_per_thread(tmp_path):
    """A thread started inside a block does not see it; two threads planning at once each
    see their own directory."""
    seen: dict[str, Path] = {}
    with using_cache_dir(tmp_path / "main"):
        t = threading.Thread(target=lambda: seen.update(started_inside=cache_root()))
        t.start()
        t.join()
    assert seen["started_inside"] == cache_root() != tmp_path / "main"

    both_inside = threading.Barrier(2)

    def plan_in(name: str) -> None:
        with using_cache_dir(tmp_path / name):
            both_inside.wait(timeout=10)  # the other thread's block is open now too
            seen[name] = cache_root()
            both_inside.wait(timeout=10)

    threads = [threading.Thread(target=plan_in, args=(n,)) for n in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen["x"] == tmp_path / "x" and seen["y"] == tmp_path / "y"


def test_a_cache_dir_that_is_not_a_directory_is_refused(tmp_path):
    a_file = tmp_path / "plan.json"
    a_file.write_text("{}")
    with pytest.raises(ValueError, match="plan.json' exists and is not a directory"):
        with using_cache_dir(a_file):
            pass
    with pytest.raises(ValueError, match="cache_dir is empty"):
        with using_cache_dir(""):
            pass
    with pytest.raises(ValueError, match="cache_dir must be a path, got int"):
        with using_cache_dir(3):  # type: ignore[arg-type]
            pass


# ----------------------------------------------------------------------------------------
# What a cached measurement is keyed by
# ----------------------------------------------------------------------------------------


def test_a_measurement_under_another_fbgemm_or_thread_count_is_not_found(tmp_path, monkeypatch):
    """The reference kernel cached here is read back; with another FBGEMM version, or timers
    on another thread count, the file is not found and the kernel is measured again, into a
    file of its own. The full key is written in each file."""
    calls: list[int] = []
    fake_reference(monkeypatch, calls)
    with using_cache_dir(tmp_path):
        assert rt.load_reference_ms() == (2.0, 20.0) and len(calls) == 1
        forget_loaded()
        assert rt.load_reference_ms() == (2.0, 20.0) and len(calls) == 1  # read back

        monkeypatch.setattr(hardware, "fbgemm_version", lambda: "0.0.1-other")
        forget_loaded()
        rt.load_reference_ms()
        assert len(calls) == 2
        monkeypatch.undo()
        fake_reference(monkeypatch, calls)

        monkeypatch.setattr(hardware, "measuring_threads", lambda device="cpu": 4)
        forget_loaded()
        rt.load_reference_ms()
        assert len(calls) == 3
    files = sorted(tmp_path.glob("reference_kernel_cpu_*.json"))
    keys = [json.loads(f.read_text())["key"] for f in files]
    assert len(files) == 3
    assert sorted(k["fbgemm_gpu"] for k in keys).count("0.0.1-other") == 1
    assert sorted(k["threads"] for k in keys) == [1, 1, 4]
    assert all(k["torch"] == torch.__version__ and k["host"] == socket.gethostname() for k in keys)


def test_the_callers_thread_count_does_not_move_the_cache(tmp_path, monkeypatch):
    """The timers run a CPU kernel on one thread whatever the caller set (the key records
    that count), so a rank with one thread (torchrun's OMP_NUM_THREADS=1) reads what a
    plan on every core measured."""
    calls: list[int] = []
    fake_reference(monkeypatch, calls)
    before = torch.get_num_threads()
    try:
        with using_cache_dir(tmp_path):
            torch.set_num_threads(2)
            rt.load_reference_ms()
            forget_loaded()
            torch.set_num_threads(1)
            rt.load_reference_ms()
    finally:
        torch.set_num_threads(before)
    assert len(calls) == 1


def test_the_timers_run_on_the_thread_count_the_key_records(monkeypatch):
    """The key's ``threads`` is what the CPU timer runs the kernel with, whatever the
    caller's count."""
    import numpy as np

    from torchrec_dreamshard.measure import embedding_kernels
    from torchrec_dreamshard.measure.embedding_kernels import REFERENCE_TABLES

    seen: list[int] = []

    def record_threads(kernels, config):
        seen.append(torch.get_num_threads())
        return np.ones((config.rounds, len(kernels), 2))

    monkeypatch.setattr(embedding_kernels, "time_kernels", record_threads)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        embedding_kernels.time_fused_kernel(list(REFERENCE_TABLES[:1]), 64)
    finally:
        torch.set_num_threads(before)
    assert seen == [measurement_key("cpu")["threads"]] == [1]
    with single_thread():
        assert torch.get_num_threads() == hardware.measuring_threads("cpu")


def test_the_collectives_are_keyed_by_their_topology():
    """A job's collectives are cached per backend, world size, ranks per host and hosts."""
    one_host = collective_models.group_collectives_file("gloo", ["a", "a"])
    two_hosts = collective_models.group_collectives_file("gloo", ["a", "b"])
    four = collective_models.group_collectives_file("gloo", ["a"] * 4)
    assert len({one_host.path, two_hosts.path, four.path}) == 3
    assert one_host.key["topology"] == {
        "backend": "gloo",
        "world_size": 2,
        "local_world_size": 2,
        "hosts": ["a", "a"],
    }
    assert two_hosts.key["topology"]["local_world_size"] == 1
    assert one_host.path.name.startswith("collectives_gloo_2ranks_")
    outside = collective_models.collectives_cache_file("gloo")
    assert outside.key["topology"]["ranks"] == "threads"
    assert outside.key["fbgemm_gpu"] == hardware.fbgemm_version()


def test_files_of_an_older_format_are_ignored_not_crashed_on(tmp_path, monkeypatch, run_cli):
    """An older version's file (named for host, device and torch, no key inside) is never
    read, nor is a file at this key's name whose envelope holds another key or format: the
    kernel is measured again. ``dreamshard cache`` shows the old file as such and
    ``--clear`` removes it."""
    calls: list[int] = []
    fake_reference(monkeypatch, calls)
    old_key = stable_key([socket.gethostname(), hardware.cpu_name(), torch.__version__])
    old = tmp_path / f"reference_kernel_cpu_{old_key}.json"
    old.write_text(json.dumps({"version": 1, "fwd_ms": 9.0, "bwd_ms": 9.0}))
    with using_cache_dir(tmp_path):
        current = rt.reference_cache_file()
        envelope = {"dreamshard_cache": 1, "kind": "reference_kernel", "value": {"x": 1}}
        current.path.write_text(json.dumps({**envelope, "key": {**current.key, "torch": "1.0"}}))
        assert rt.load_reference_ms() == (2.0, 20.0) and len(calls) == 1
        forget_loaded()
        current.path.write_text(json.dumps({**envelope, "dreamshard_cache": 99}))
        assert rt.load_reference_ms() == (2.0, 20.0) and len(calls) == 2
    assert json.loads(old.read_text())["fwd_ms"] == 9.0  # left as it was
    assert run_cli(["cache", "--cache-dir", str(tmp_path)]) == 0
    assert run_cli(["cache", "--cache-dir", str(tmp_path), "--clear", "reference_kernel"]) == 0
    assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------------------
# dreamshard cache
# ----------------------------------------------------------------------------------------


def _store_with_fed_inputs(store: Path) -> None:
    """What a running job fed two tables, kept in ``store`` as a re-plan keeps it."""
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from torchrec_dreamshard.store.fed_inputs_store import remember_inputs

    configs = [
        EmbeddingBagConfig(name=n, embedding_dim=8, num_embeddings=100, feature_names=[f"f{n}"])
        for n in ("t0", "t1")
    ]
    model = torch.nn.Module()
    model.ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    assert remember_inputs(store, model, {"ebc.t0": [3.0], "ebc.t1": [1.0]}, {}) == 2


def test_the_command_lists_a_real_cold_measurement_and_clear_empties_it(
    tmp_path, monkeypatch, run_cli, capsys
):
    """The reference kernel measured for real into an empty cache, and a store with what a
    job fed its tables: ``dreamshard cache`` names the directory, each item's kind, size,
    age and key (this machine's); ``--clear KIND`` removes that kind alone, ``--clear``
    the rest, leaving a file that is not the planner's; then the cache is empty, and the
    next load measures again."""
    cache = tmp_path / "cache"
    with using_cache_dir(cache):
        fwd, bwd = rt.load_reference_ms()  # real FBGEMM kernels, timed here
        _store_with_fed_inputs(default_store_path())
    assert fwd > 0 and bwd > 0
    (cache / "notes.txt").write_text("mine")
    assert run_cli(["cache", "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    key = measurement_key("cpu")
    assert f"cache directory: {cache} (from cache_dir)" in out
    assert "reference_kernel: reference_kernel_cpu_" in out and "s old" in out
    assert f"threads=1 torch='{key['torch']}' fbgemm_gpu='{key['fbgemm_gpu']}'" in out
    assert "measured on this machine" in out
    assert "calibration: calibration.sqlite" in out and "2 tables' fed inputs" in out
    assert "2 item(s)" in out and "1 other file(s)" in out

    assert run_cli(["cache", "--cache-dir", str(cache), "--clear", "fed_inputs"]) == 0
    assert "forgot 2 tables' fed inputs in calibration.sqlite" in capsys.readouterr().out
    assert run_cli(["cache", "--cache-dir", str(cache), "--clear", "reference_kernel"]) == 0
    assert "removed reference_kernel_cpu_" in capsys.readouterr().out
    assert (cache / "calibration.sqlite").exists()
    assert run_cli(["cache", "--cache-dir", str(cache), "--clear"]) == 0
    assert "removed calibration.sqlite (calibration" in capsys.readouterr().out
    assert [p.name for p in cache.iterdir()] == ["notes.txt"]
    assert run_cli(["cache", "--cache-dir", str(cache)]) == 0
    assert "the cache is empty" in capsys.readouterr().out

    calls: list[int] = []
    fake_reference(monkeypatch, calls)
    with using_cache_dir(cache):
        rt.load_reference_ms()
    assert calls == [1]  # nothing of the cleared cache remembered


def test_a_store_the_environment_names_elsewhere_is_shown_never_cleared(
    tmp_path, monkeypatch, run_cli, capsys
):
    named = tmp_path / "shared" / "costs.sqlite"
    named.parent.mkdir()
    _store_with_fed_inputs(named)
    monkeypatch.setenv(STORE_ENV, str(named))
    assert run_cli(["cache"]) == 0
    out = capsys.readouterr().out
    assert "costs.sqlite" in out and "never cleared" in out
    assert run_cli(["cache", "--clear"]) == 0
    assert "nothing to clear (all)" in capsys.readouterr().out
    assert named.exists()


def test_an_unknown_kind_is_refused_naming_the_kinds(run_cli, capsys):
    assert run_cli(["cache", "--clear", "kernels"]) == 2
    err = capsys.readouterr().err
    assert "unknown cache kind 'kernels'" in err and "reference_kernel" in err


def test_the_help_names_every_kind():
    for kind in KINDS:
        assert f"\n  {kind} " in EXAMPLES


def test_the_listing_says_what_of_a_key_differs_from_here(tmp_path, run_cli, capsys):
    """A file measured under torch 1.0, and one on a GPU this machine lacks: each is listed
    with what differs (neither is read here)."""
    from torchrec_dreamshard.cache.machine_cache import CacheFile, write_cached_data

    with using_cache_dir(tmp_path):
        here = rt.reference_cache_file()
    old_torch = {**here.key, "torch": "1.0"}
    write_cached_data(
        CacheFile(tmp_path / "dense_kernel_cpu_x.json", "dense_kernel", old_torch), {}, "t"
    )
    gpu = {**here.key, "device": "cuda", "device_name": "Some GPU", "threads": 0}
    write_cached_data(
        CacheFile(tmp_path / "dense_kernel_cuda_y.json", "dense_kernel", gpu), {}, "t"
    )
    assert run_cli(["cache", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"differs from here: torch '1.0' (here '{torch.__version__}')" in out
    if not torch.cuda.is_available():
        assert "differs from here: no cuda device here" in out
