"""What a user reads is true: the README's results and the docs' generated figures agree
with `benchmarks/results/` (`benchmarks/readme_figures.py --check`), a figure altered by
hand is named, every path and module the README and docs cite exists, and the README's
set-up is two commands. Nothing is measured."""

from __future__ import annotations

import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "readme_figures.py"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FILE = re.compile(r"^[\w.\-/]+\.(?:py|md|json|txt|toml|sqlite|pt|csv|png|cfg|sh)$")
MODULE_REF = re.compile(r"\btorchrec_dreamshard(?:\.\w+)+")
# files a page names that are not in this repository, and why
NOT_HERE = {
    "examples/dlrm/dlrm_main.py": "TorchRec's repository",
    "fbgemm_t856_bs65536.pt": "Meta's dataset, downloaded by the user",
}
# names of files the commands write (outputs, not citations)
OUTPUTS = {
    "metrics.csv",
    "curves.png",
    "checkpoint.pt",
    "costs.sqlite",
    "calibration.sqlite",
    "results.json",
    "profile.pt",
    "profile.json",
    "manifest.json",
    "collectives_analytic.json",
    "model.json",
    "my.pt",
}


def _load():
    spec = importlib.util.spec_from_file_location("readme_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["readme_figures"] = module
    spec.loader.exec_module(module)
    return module


def test_the_readme_and_docs_agree_with_the_results_files():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def copy(tmp_path):
    """The pages the script writes, copied to ``tmp_path`` (the repository's stay as they are)."""
    figures = _load()
    for page in {part.page for part in [*figures.BLOCKS, *figures.LINES]}:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / page, tmp_path / page)
    return figures, tmp_path


def _demo_ms(readme: str) -> str:
    """The demo row's measured step of the default planner (``44.330``), as the README has it."""
    return re.search(r"\| (\d+\.\d{3}) ms, default planner", readme).group(1)


def test_a_figure_altered_by_hand_is_named(copy):
    figures, root = copy
    assert figures.disagreements(root) == []
    readme = root / "README.md"
    text = readme.read_text()
    ms = _demo_ms(text)  # the demo row, as demo.json has it (the check above agrees)
    altered = f"{float(ms) - 1:.3f}"
    readme.write_text(
        text.replace(f"| {ms} ms, default planner", f"| {altered} ms, default planner")
    )
    results = root / "docs" / "results.md"
    results.write_text(results.read_text().replace("| 639.4 |", "| 323.5 |"))
    problems = figures.disagreements(root)
    assert len(problems) == 2, problems
    assert problems[0].startswith("README.md: disagrees") and f"{altered} ms" in problems[0]
    assert problems[1].startswith("docs/results.md: disagrees") and "323.5" in problems[1]


def test_a_hand_altered_line_outside_a_block_is_named_and_rewritten(copy):
    figures, root = copy
    page = root / "docs" / "results.md"
    text = page.read_text()
    line = next(x for x in text.splitlines() if x.startswith(figures.LINES[0].prefix))
    below = re.search(r"(\d+\.\d)% below", line).group(0)
    page.write_text(text.replace(line, line.replace(below, "99.9% below")))
    (problem,) = figures.disagreements(root)
    assert "99.9% below" in problem
    pages, errors = figures.generate(root)
    assert not errors and line in pages["docs/results.md"].splitlines()


def test_a_results_file_that_changed_makes_the_check_fail(copy, tmp_path_factory, monkeypatch):
    figures, root = copy
    results = tmp_path_factory.mktemp("results")
    for name in ("demo.json", "demo.txt"):
        shutil.copy(figures.RESULTS / name, results / name)
    monkeypatch.setattr(figures, "RESULTS", results)
    demo = results / "demo.txt"
    ms = _demo_ms((root / "README.md").read_text())
    altered = f"{float(ms) + 1:.3f}"
    demo.write_text(demo.read_text().replace(ms, altered))
    problems = figures.disagreements(root)
    assert any(f"demo.txt says {altered}" in p for p in problems), problems


def test_a_missing_marker_is_named(copy):
    figures, root = copy
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("<!-- replan:end -->", ""))
    problems = figures.disagreements(root)
    assert any("README.md [replan]" in p and "0 'replan' blocks" in p for p in problems), problems


def test_hosts_and_commits_come_from_the_files():
    figures = _load()
    assert figures.host({"machine": {"device_name": "Intel(R) Xeon(R) Processor"}}) == "Intel Xeon"
    assert figures.host({"rows": []}) == figures.NO_HOST
    assert figures.commit({"meta": {"host": {"commit": "f20dcc448f765c7c06db54ef"}}}) == "f20dcc4"
    assert figures.commit({"machine": {}}) == "commit not recorded"


def _repository_files() -> list[str]:
    """Every file of the repository, relative to it (tracked, or new and not ignored)."""
    done = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:  # no git: every file under the repository
        return [
            str(p.relative_to(REPO))
            for p in REPO.rglob("*")
            if p.is_file() and not {".git", ".venv", ".venv-1.9"} & set(p.parts)
        ]
    return [f for f in done.stdout.split() if (REPO / f).exists()]


def _cited_files(page: Path):
    """``(line, path)`` of every file path in a code span of ``page`` (outside code blocks)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), page.read_text())
    for m in CODE_SPAN.finditer(text):
        for token in re.split(r"[\s,()]+", m.group(1)):
            token = token.strip(":;.")
            if FILE.match(token):
                yield text[: m.start()].count("\n") + 1, token


def _placeholder(token: str) -> bool:
    """A name the reader fills in (``TASK.json``, ``OUT_DIR/metrics.csv``, ``_raw.json``)."""
    return token.startswith("_") or bool(re.search(r"(^|/)[A-Z][A-Z_]*[A-Z][._/]", token))


def _exists(token: str, files: list[str]) -> bool:
    """Whether ``token`` is a file of the repository: a bare name anywhere in it, a path
    the end of one (``planner/steps/verify_step.py``, ``stages/candidates.py``), or
    TorchRec's own source as installed (``torchrec/...``)."""
    if token.startswith("torchrec/"):
        spec = importlib.util.find_spec("torchrec")
        return spec is not None and (Path(spec.origin).parent.parent / token).exists()
    token = token.removeprefix("./").removeprefix("../")
    return any(f == token or f.endswith("/" + token) for f in files)


def test_every_path_the_readme_and_docs_cite_exists():
    """Every file path in a code span (`planner/steps/verify_step.py`, `demo.txt`) names a
    file of the repository or of the installed TorchRec; placeholders and the commands'
    outputs aside."""
    files = _repository_files()
    missing = []
    for page in PAGES:
        for line, token in _cited_files(page):
            if _exists(token, files) or token in NOT_HERE or token in OUTPUTS:
                continue
            if not _placeholder(token):
                missing.append(f"{page.relative_to(REPO)}:{line}: {token}")
    assert not missing, missing


def _resolves(ref: str) -> bool:
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_module_the_readme_and_docs_name_imports():
    """Every ``torchrec_dreamshard.a.b.c`` the pages name is a module, or an attribute of
    one (code blocks included)."""
    broken = []
    for page in PAGES:
        text = page.read_text()
        for m in MODULE_REF.finditer(text):
            if not _resolves(m.group(0).rstrip(".")):
                line = text[: m.start()].count("\n") + 1
                broken.append(f"{page.relative_to(REPO)}:{line}: {m.group(0)}")
    assert not broken, broken


def test_the_readme_sets_up_in_two_commands():
    text = (REPO / "README.md").read_text()
    setup = text.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    commands = [
        line.split("#")[0].strip() for line in setup.splitlines() if line.startswith("    ")
    ]
    assert commands == ["make demo", "make test"], commands
