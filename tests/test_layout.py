"""The package's shape, checked by parsing its source (nothing is imported): modules and
functions stay small, the policy never reaches TorchRec's planner, and agents are used
through their declared protocol (the layer order and circles: tests/test_layers.py).
And the documentation's shape: a short README whose links, and the docs' links, resolve."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "torchrec_dreamshard"
README = REPO / "README.md"
DOCS = REPO / "docs"
BENCHMARKS = REPO / "benchmarks"
MAX_README_LINES = 300  # the README is a front page; the rest lives in docs/
MAX_ROOT_MODULES = 6  # counting __init__.py
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60  # lines of code: no blank lines, comments or docstring
# what the policy may not import (the planner side hands its candidates in)
POLICY_BANNED = (
    "torchrec.distributed.planner",
    "torchrec_dreamshard.planner",
)
# expressions that hold an agent or a TorchRec component: their members are declared, so
# no getattr probes them
TYPED_HOLDERS = {"agent", "self._agent", "self.agent", "proposer", "enumerator"}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _code_lines(func: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> int:
    """Non-blank, non-comment lines of ``func``'s body, its docstring left out."""
    body = func.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    if not body:
        return 0
    first, last = body[0].lineno, max(n.end_lineno or n.lineno for n in body)
    # decorators and signature lines before the body are not counted; neither are a
    # nested function's docstring lines (they are few and rare)
    text = lines[first - 1 : last]
    return sum(1 for line in text if line.strip() and not line.strip().startswith("#"))


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _imports(tree: ast.Module) -> Iterator[str]:
    """Every module an import statement names, at any depth (inside functions too)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def test_few_modules_at_the_root():
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


def test_no_two_modules_share_a_file_name():
    """A file name says what its module holds: ``store.py`` in two folders says neither."""
    names: dict[str, list[str]] = {}
    for path in _modules():
        if path.name != "__init__.py":
            names.setdefault(path.name, []).append(_name(path))
    shared = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert not shared, shared


def test_no_module_is_long():
    sizes = {_name(p): len(p.read_text().splitlines()) for p in _modules()}
    long = {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_function_is_long():
    offenders = []
    for path in _modules():
        lines = path.read_text().splitlines()
        for func in _functions(_tree(path)):
            n = _code_lines(func, lines)
            if n > MAX_FUNCTION_LINES:
                offenders.append(f"{_name(path)}:{func.lineno} {func.name} ({n} lines)")
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines of code: {offenders}"


def test_the_policy_never_imports_torchrecs_planner():
    offenders = []
    for path in sorted((PACKAGE / "policy").rglob("*.py")):
        for name in _imports(_tree(path)):
            if name.startswith(POLICY_BANNED) or name.endswith("torchrec_adapter"):
                offenders.append(f"{_name(path)}: {name}")
    assert not offenders, offenders


def test_agents_and_components_are_not_probed_with_getattr():
    offenders = []
    for path in _modules():
        for node in ast.walk(_tree(path)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and node.args
                and ast.unparse(node.args[0]) in TYPED_HOLDERS
            ):
                offenders.append(f"{_name(path)}:{node.lineno} {ast.unparse(node)}")
    assert not offenders, offenders


def test_no_agent_is_typed_any():
    """Every parameter that takes an agent (named ``agent`` or ``*_agent``) is typed with
    what it needs (the protocol, or a concrete agent), not ``Any``."""
    offenders = []
    for path in _modules():
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            for arg in args:
                named = arg.arg == "agent" or arg.arg.endswith("_agent")
                if named and (arg.annotation is None or ast.unparse(arg.annotation) == "Any"):
                    offenders.append(f"{_name(path)}:{node.lineno} {node.name}({arg.arg})")
    assert not offenders, offenders


# --- the documentation --------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def _markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _links(text: str) -> list[str]:
    """Every markdown link target outside code blocks and code spans."""
    return LINK.findall(CODE_SPAN.sub("", FENCE.sub("", text)))


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {_anchor(m) for m in re.findall(r"^#+\s+(.*)$", text, re.M)}


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; move detail to docs/"


def test_every_relative_link_resolves():
    """Every relative link in README.md and docs/*.md names a file of the repository (and,
    with a #fragment, one of that file's headings)."""
    broken = []
    for page in _markdown_files():
        for target in _links(page.read_text()):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)} -> {target}"
            if not dest.is_relative_to(REPO) or not dest.exists():
                broken.append(f"{where}: no such file")
            elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
                broken.append(f"{where}: no such heading")
    assert not broken, broken


def test_every_benchmark_script_is_documented():
    """docs/benchmarks.md names every benchmark script."""
    text = (DOCS / "benchmarks.md").read_text()
    scripts = sorted(p.name for p in BENCHMARKS.glob("*.py"))
    missing = [name for name in scripts if f"`{name}`" not in text]
    assert not missing, f"benchmarks not described in docs/benchmarks.md: {missing}"


# --- the benchmarks -----------------------------------------------------------------------


def _benchmark_offences(path: Path, scripts: set[str]) -> Iterator[str]:
    """How the script at ``path`` reaches past the package: a ``sys.path`` edit (or any
    use of it), an import of another script (named in ``scripts``), a relative import."""
    tree = _tree(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and ast.unparse(node) == "sys.path":
            yield f"{path.name}:{node.lineno} uses sys.path"
        if isinstance(node, ast.ImportFrom) and node.level:
            yield f"{path.name}:{node.lineno} imports relatively"
    for name in _imports(tree):
        if name.split(".")[0] in scripts or name == "sys.path":
            yield f"{path.name} imports {name}"


def test_benchmarks_are_scripts_over_the_package_and_the_harness():
    """benchmarks/ holds scripts: what they share lives in the package or in their
    harness (``benchmarks/harness/``, imported as ``harness``), so no helper module sits
    beside them (``_*.py``), no script or harness module edits ``sys.path`` and none
    imports a script."""
    paths = sorted(BENCHMARKS.glob("*.py"))
    scripts = {p.stem for p in paths}
    offenders = [f"{p.name} is a helper module" for p in paths if p.name.startswith("_")]
    for path in [*paths, *sorted((BENCHMARKS / "harness").glob("*.py"))]:
        offenders += _benchmark_offences(path, scripts)
    assert not offenders, offenders


def test_the_package_never_imports_the_benchmarks_harness():
    """The harness imports the package, never the other way: the package ships without
    ``benchmarks/``."""
    offenders = [
        f"{_name(path)} imports {name}"
        for path in _modules()
        for name in _imports(_tree(path))
        if name.split(".")[0] == "harness"
    ]
    assert not offenders, offenders
