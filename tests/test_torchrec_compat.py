"""TorchRec's internals are read in one place and patched nowhere.

- The installed TorchRec has every internal ``torchrec_compat`` relies on; one that is
  missing fails the import with the version, the supported releases and what to do.
- The same for the private names of torch itself that ``torch_compat`` reads.
- A scan of the package's source (``ast``, nothing imported): no private TorchRec or torch
  name is read outside ``torchrec_compat.py`` and ``ranks/torch_compat.py``, and no
  attribute of a torch, TorchRec or FBGEMM module is assigned anywhere but in the one
  documented workaround.
- ``HookedEnumerator`` enumerates what TorchRec's enumerator does, without its copy.
- The workaround's bug is still there (two processes tag a reshard differently); the test
  fails once TorchRec fixes it, so the workaround can go.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest
import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.sharding import dynamic_sharding
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from torchrec_dreamshard import torchrec_compat
from torchrec_dreamshard.ranks import torch_compat
from torchrec_dreamshard.torchrec_compat import (
    HookedEnumerator,
    process_independent_reshard_tags,
    process_independent_tag,
)

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "torchrec_dreamshard"
COMPAT = PACKAGE / "torchrec_compat.py"
TORCH_COMPAT = PACKAGE / "ranks" / "torch_compat.py"  # torch's own private names
THIRD_PARTY = ("torch", "torchrec", "fbgemm_gpu")  # whose modules nothing may patch
PRIVATE_OWNERS = ("torchrec", "fbgemm_gpu", "torch")  # whose private names stay in COMPAT
# the one function allowed to assign a TorchRec module's attribute (docstring: the bug)
WORKAROUND = "process_independent_reshard_tags"
# methods of TorchRec objects the package replaces on an instance (in COMPAT only)
REPLACED_METHODS = {"input_dist"}


# -- the import-time checks ---------------------------------------------------------------


def test_the_installed_torchrec_has_every_internal_used():
    assert torchrec_compat._missing() == []
    assert torchrec_compat.torchrec_is_supported(), torchrec_compat.TORCHREC_VERSION


def test_supported_releases():
    supported = torchrec_compat.torchrec_is_supported
    assert supported("1.8.0") and supported("1.9.2") and supported("1.9.0+cpu")
    assert not supported("1.7.0") and not supported("1.10.0") and not supported("nightly")


@pytest.mark.parametrize(
    "owner, name",
    [
        ("torchrec.distributed.planner.storage_reservations", "_get_dense_tensor_size"),
        ("torchrec.distributed.sharding.dynamic_sharding", "_generate_tag"),
        ("torchrec.distributed.planner.enumerators.EmbeddingEnumerator", "_filter_sharding_types"),
    ],
)
def test_a_missing_internal_fails_the_import_naming_version_and_remedy(monkeypatch, owner, name):
    module, _, cls = owner.rpartition(".")
    try:
        target = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError):
        target = importlib.import_module(owner)
    monkeypatch.delattr(target, name)
    with pytest.raises(ImportError) as error:
        torchrec_compat.check_torchrec()
    message = str(error.value)
    assert name in message and torchrec_compat.TORCHREC_VERSION in message
    assert "TorchRec 1.8.x" in message and "1.9.x" in message and "pip install" in message


def test_a_torch_without_a_private_name_we_read_fails_the_import(monkeypatch):
    """A gloo backend without the flat all-gather (a torch that renamed it)."""
    gloo = torch.distributed.ProcessGroupGloo
    kept = ("_Options", "create_device", "_reduce_scatter_base")
    fake = type("ProcessGroupGloo", (), {name: getattr(gloo, name) for name in kept})
    monkeypatch.setattr(torch_compat, "dist", types.SimpleNamespace(ProcessGroupGloo=fake))
    with pytest.raises(ImportError) as error:
        torch_compat.check_torch()
    message = str(error.value)
    assert "ProcessGroupGloo._allgather_base" in message and torch.__version__ in message
    assert "_reduce_scatter_base" not in message and "torch>=2.13,<2.15" in message


def test_a_changed_signature_fails_the_import(monkeypatch):
    from torchrec.distributed.planner import storage_reservations

    monkeypatch.setattr(
        storage_reservations, "_get_dense_tensor_size", lambda model, modules, factor=6.0: 0
    )
    with pytest.raises(ImportError, match="_get_dense_tensor_size"):
        torchrec_compat.check_torchrec()


# -- the source scan ----------------------------------------------------------------------


def _modules_of(tree: ast.Module) -> dict[str, str]:
    """Local name -> module path of every name ``tree`` binds to a torch, TorchRec or FBGEMM
    module (``import torch``, ``import torch.distributed as dist``, ``from
    torchrec.distributed.sharding import dynamic_sharding``)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in THIRD_PARTY:
                    local = alias.asname or alias.name.split(".")[0]
                    out[local] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in THIRD_PARTY:
                continue
            for alias in node.names:
                path = f"{node.module}.{alias.name}"
                try:
                    importlib.import_module(path)
                except ImportError:
                    continue  # not a module
                out[alias.asname or alias.name] = path
    return out


def _is_torchrec_class(value: object) -> bool:
    return isinstance(value, type) and any(
        c.__module__.split(".")[0] == "torchrec" for c in value.__mro__
    )


def _third_party_names(tree: ast.Module) -> dict[str, type]:
    """Local name -> class of every TorchRec class ``tree`` imports, and of every class
    derived from one it imports from the package (``HookedEnumerator``)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in (*PRIVATE_OWNERS, "torchrec_dreamshard"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    value = getattr(module, alias.name, None)
                    if _is_torchrec_class(value):
                        out[alias.asname or alias.name] = value
    return out


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _torchrec_internals() -> set[str]:
    """The private names the compatibility module reads off TorchRec objects: what no other
    module may read, whatever it is read off."""
    names = set()
    for compat in (COMPAT, TORCH_COMPAT):
        for node in ast.walk(ast.parse(compat.read_text())):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    names.add(node.attr)
                elif node.attr.startswith(("_last_stored", "_filter_")):
                    names.add(node.attr)
    return names


class _Scan:
    """One module's source: where it reads TorchRec's private names, and where it assigns
    a third-party module's attributes."""

    def __init__(self, source: str, name: str, internals: set[str]) -> None:
        self.tree = ast.parse(source)
        self.name = name
        self.internals = internals
        self.modules = _modules_of(self.tree)
        self.classes = _third_party_names(self.tree)
        self.found: list[str] = []

    def where(self, node: ast.AST, what: str) -> None:
        self.found.append(f"{self.name}:{getattr(node, 'lineno', '?')} {what}")

    def private_reads(self, mixins: dict[str, set[str]]) -> list[str]:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] in PRIVATE_OWNERS:
                    for alias in node.names:
                        if _private(alias.name):
                            self.where(node, f"imports {node.module}.{alias.name}")
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                receiver = node.value
                if isinstance(receiver, ast.Name) and receiver.id in self.modules:
                    self.where(node, f"reads {ast.unparse(node)} of a third-party module")
                elif node.attr in self.internals and not (
                    isinstance(receiver, ast.Name) and receiver.id in ("self", "cls")
                ):
                    self.where(node, f"reads TorchRec's {ast.unparse(node)}")
            elif isinstance(node, ast.ClassDef):
                self._class_reads(node, mixins.get(node.name, set()))
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and target.attr in REPLACED_METHODS:
                        self.where(node, f"replaces TorchRec's {ast.unparse(target)}")
        return self.found

    def _class_reads(self, cls: ast.ClassDef, inherited: set[str]) -> None:
        """``self._x`` (read, or a method defined) in a class derived from a TorchRec class
        (or mixed into one), where ``_x`` is a name that TorchRec class uses."""
        used = set(inherited)
        for base in cls.bases:
            value = self.classes.get(ast.unparse(base))
            if value is not None:
                used |= torchrec_compat._names_used_by(value)
        used = {n for n in used if _private(n)}
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef) and node.name in used:
                self.where(node, f"overrides TorchRec's {cls.name}.{node.name}")
            elif (
                isinstance(node, ast.Attribute)
                and node.attr in used
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                self.where(node, f"reads TorchRec's self.{node.attr} in {cls.name}")

    def module_assignments(self, allowed_function: str | None = None) -> list[str]:
        allowed = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.FunctionDef) and node.name == allowed_function:
                allowed |= {id(n) for n in ast.walk(node)}
        for node in ast.walk(self.tree):
            if id(node) in allowed:
                continue
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign | ast.Delete):
                targets = list(node.targets)
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("setattr", "delattr")
                and node.args
            ):
                targets = [ast.Attribute(value=node.args[0], attr="?")]
            while targets:
                target = targets.pop()
                if isinstance(target, ast.Tuple | ast.List | ast.Starred):
                    targets += (
                        target.elts if not isinstance(target, ast.Starred) else [target.value]
                    )
                elif isinstance(target, ast.Attribute) and _root(target) in self.modules:
                    self.where(node, f"assigns {ast.unparse(target)} of a third-party module")
        return self.found


def _package_sources() -> list[tuple[str, str]]:
    return [
        (str(p.relative_to(REPO)), p.read_text())
        for p in sorted(PACKAGE.rglob("*.py"))
        if p not in (COMPAT, TORCH_COMPAT)
    ]


def _mixins(sources: list[tuple[str, str]]) -> dict[str, set[str]]:
    """Class name -> TorchRec names of the TorchRec class it is mixed into (a class listed
    before a TorchRec class in another class's bases, e.g. ``Replanning``)."""
    out: dict[str, set[str]] = {}
    for _, source in sources:
        tree = ast.parse(source)
        classes = _third_party_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [ast.unparse(b) for b in node.bases]
            torchrec_bases = [classes[b] for b in bases if b in classes]
            for base in bases:
                if base not in classes:
                    for value in torchrec_bases:
                        out.setdefault(base, set()).update(torchrec_compat._names_used_by(value))
    return out


def test_no_private_torchrec_name_is_read_outside_the_compatibility_module():
    internals = _torchrec_internals()
    assert {"_best_plan", "_generate_tag", "_dmp_wrapped_module"} <= internals
    assert {"_Options", "_allgather_base", "_reduce_scatter_base"} <= internals  # torch's
    sources = _package_sources()
    mixins = _mixins(sources)
    found = []
    for name, source in sources:
        found += _Scan(source, name, internals).private_reads(mixins)
    assert not found, "use torchrec_compat's functions instead:\n" + "\n".join(found)


def test_no_module_of_torch_torchrec_or_fbgemm_is_patched():
    found = []
    for name, source in _package_sources():
        found += _Scan(source, name, set()).module_assignments()
    compat = _Scan(COMPAT.read_text(), "torchrec_compat.py", set())
    found += compat.module_assignments(allowed_function=WORKAROUND)
    assert not found, "\n".join(found)
    # the exception is where it is documented, and it is the only one
    everywhere = _Scan(COMPAT.read_text(), "torchrec_compat.py", set()).module_assignments()
    assert everywhere and all("dynamic_sharding._generate_tag" in f for f in everywhere)


EXAMPLE = """
import torch
from torch import nn
import torchrec.distributed as trd
from torchrec.distributed.sharding import dynamic_sharding
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.storage_reservations import _get_dense_tensor_size

class Mine(EmbeddingEnumerator):
    def _filter_sharding_types(self, name, allowed, key=""):
        return self._sharder_map

class Mixin:
    def topology(self):
        return self._topology

class Planner(Mixin, EmbeddingShardingPlanner):
    pass

def f(planner, dmp):
    dynamic_sharding._generate_tag = len
    setattr(trd, "x", 1)
    torch.backends.mkldnn.enabled = False
    nn.Module.forward = None
    dmp.module.ebc.input_dist = print
    return planner._best_plan, dmp._dmp_wrapped_module, trd._private
"""


def test_the_scan_finds_what_it_looks_for():
    """The scans above, on a module that does each thing they forbid."""
    internals = _torchrec_internals()
    scan = _Scan(EXAMPLE, "example", internals)
    reads = "\n".join(scan.private_reads(_mixins([("example", EXAMPLE)])))
    for expected in (
        "imports torchrec.distributed.planner.storage_reservations._get_dense_tensor_size",
        "overrides TorchRec's Mine._filter_sharding_types",
        "self._sharder_map in Mine",
        "self._topology in Mixin",
        "planner._best_plan",
        "dmp._dmp_wrapped_module",
        "trd._private of a third-party module",
        "replaces TorchRec's dmp.module.ebc.input_dist",
    ):
        assert expected in reads, (expected, reads)
    writes = "\n".join(_Scan(EXAMPLE, "example", set()).module_assignments())
    for expected in ("dynamic_sharding._generate_tag", "trd.?", "torch.backends", "nn.Module"):
        assert f"assigns {expected}" in writes, (expected, writes)


# -- the enumerator without TorchRec's copy -----------------------------------------------


class Model(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name=f"t{i}",
                    embedding_dim=16 * (1 + i % 3),
                    num_embeddings=1000 * (i + 1),
                    feature_names=[f"f{i}"],
                )
                for i in range(n)
            ],
            device=torch.device("meta"),
        )


def _described(options) -> list[tuple]:
    return sorted(
        (
            o.fqn,
            o.sharding_type,
            o.compute_kernel,
            tuple((tuple(s.size), tuple(s.offset), s.storage, s.perf) for s in o.shards),
        )
        for o in options
    )


def test_the_hooked_enumerator_enumerates_what_torchrec_s_does_without_keeping_a_copy():
    topology = Topology(world_size=4, compute_device="cpu")
    constraints = {"t1": ParameterConstraints(sharding_types=["table_wise", "row_wise"])}
    model, sharders = Model(5), [EmbeddingBagCollectionSharder()]
    theirs = EmbeddingEnumerator(topology, 128, constraints).enumerate(model, sharders)
    hooked = HookedEnumerator(topology, 128, constraints)
    ours = hooked.enumerate_uncached(model, sharders)
    assert ours and _described(ours) == _described(theirs)
    assert all(s.perf is not None and s.storage is not None for o in ours for s in o.shards)
    assert hooked.last_stored_search_space is None  # TorchRec's cache neither read nor kept
    hooked.store_search_space(model, sharders, ours)
    assert hooked.stored_search_space(model, sharders) is ours
    assert hooked.stored_search_space(Model(5), sharders) is None
    # TorchRec's own enumerate still caches and copies as TorchRec does
    again = hooked.enumerate(model, sharders)
    assert _described(again) == _described(theirs) and again is not ours


def test_the_hooks_narrow_what_torchrec_enumerates():
    class TableWiseOnly(HookedEnumerator):
        def filter_sharding_types(self, name, allowed_sharding_types, sharder_key=""):
            types = super().filter_sharding_types(name, allowed_sharding_types, sharder_key)
            assert self.sharder_for(sharder_key) is not None
            return [t for t in types if t == "table_wise"]

    topology = Topology(world_size=2, compute_device="cpu")
    options = TableWiseOnly(topology, 128).enumerate_uncached(
        Model(3), [EmbeddingBagCollectionSharder()]
    )
    assert {o.sharding_type for o in options} == {"table_wise"} and len(options) >= 3


# -- the one workaround, and the bug it works around --------------------------------------

TAGS = """
import json
from torchrec_dreamshard.torchrec_compat import process_independent_tag, torchrec_reshard_tag
args = (0, 3, 0, 1, "ebc.t0", True)
print(json.dumps([torchrec_reshard_tag(*args), process_independent_tag(*args)]))
"""


def _tags(seed: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, "-c", TAGS], env=env, stdout=subprocess.PIPE, text=True, cwd=REPO
    )


def test_torchrec_still_tags_a_reshard_differently_in_two_processes():
    """The bug :func:`process_independent_reshard_tags` works around: TorchRec's reshard tag
    is ``hash`` of a tuple holding a str, salted per process. Our tag is alike in both."""
    runs = [_tags("1"), _tags("2")]
    (theirs_1, ours_1), (theirs_2, ours_2) = (json.loads(p.communicate()[0]) for p in runs)
    assert ours_1 == ours_2
    assert theirs_1 != theirs_2, (
        f"TorchRec {torchrec_compat.TORCHREC_VERSION} now tags a reshard alike in every "
        "process: the bug is fixed, so torchrec_compat.process_independent_reshard_tags "
        "(the package's one patch of TorchRec) can go, with this test"
    )


def test_the_workaround_is_scoped_to_the_block_and_serialised():
    original = dynamic_sharding._generate_tag
    with process_independent_reshard_tags():
        assert dynamic_sharding._generate_tag is process_independent_tag
        entered = threading.Event()

        def other():
            with process_independent_reshard_tags():
                entered.set()

        thread = threading.Thread(target=other)
        thread.start()
        assert not entered.wait(0.2)  # a second reshard of ours waits for the first
    thread.join(10)
    assert entered.is_set()
    assert dynamic_sharding._generate_tag is original
    with pytest.raises(RuntimeError), process_independent_reshard_tags():
        raise RuntimeError("a reshard that fails")
    assert dynamic_sharding._generate_tag is original
    tag = process_independent_tag(0, 3, 0, 1, "ebc.t0", True)
    assert 0 <= tag <= dynamic_sharding.MAX_TAG_HASH_VALUE
    assert tag != process_independent_tag(0, 3, 0, 1, "ebc.t0", False)
