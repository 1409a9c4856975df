"""The README and docs/ stay true: the benchmarks page is what its kept JSON gives, every
link between pages resolves (files and #anchors), the architecture figure names folders and
modules that exist, and the README stays short."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "docs"))

import draw_architecture  # noqa: E402
import page  # noqa: E402

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    out, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def test_benchmarks_page_matches_its_json():
    assert (ROOT / "docs" / "benchmarks.md").read_text() == page.render_page(), \
        "docs/benchmarks.md is stale: run python bench/page.py"


def test_every_kept_result_is_shown():
    shown = {n for s in page.SECTIONS for n in s.names}
    kept = {p.stem for p in page.KEPT.glob("*.json")}
    assert kept <= shown, f"kept but on no section of bench/page.py: {sorted(kept - shown)}"


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_links_resolve(path):
    bad = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", target):
            continue                                   # http(s):, mailto:
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with that anchor in {dest.name}")
    assert not bad, f"{path.name}: " + "; ".join(bad)


def test_architecture_figure_names_what_exists():
    stack = draw_architecture.layers()            # the import-linter contract's layers
    assert len(stack) >= 5, stack
    for step in draw_architecture.CALL:
        assert importlib.util.find_spec(step.module) is not None, f"no module {step.module}"
        parts = step.module.split(".")
        assert (ROOT.joinpath(*parts).with_suffix(".py").exists()
                or (ROOT.joinpath(*parts) / "__init__.py").exists()), \
            f"{step.module} is not a module of this tree"
        draw_architecture.layer_of(step.module, stack)    # raises if in no layer


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= 200, f"README.md has {n} lines; figures and explanations go in docs/"


# Docstrings say what and why; measured figures live in docs/benchmarks.md. A docstring line
# with a figure and a unit, next to a word of measurement (measured, a bench script, a load
# average), is one that should move.
MEASURED = re.compile(r"measured|bench/\w+\.py|\bload (?:average )?\d", re.I)
FIGURE = re.compile(r"\d(?:[\d.,]*)\s?(?:-\s?[\d.]+\s?)?(?:us|ms|ns|GB/s|GiB/s|Gbit/s|Gbps|MB/s)\b"
                    r"|\d(?:\.\d+)?x (?:faster|slower|less|more|lower|higher)")
# Not measurements of polycast: the paper's figures the NIC model is built to reproduce.
NOT_MEASURED = {"polycast/models/nic.py"}


def _docstrings(path: pathlib.Path):
    import ast
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield getattr(node, "name", "<module>"), doc


def test_no_measured_figures_in_docstrings():
    found = []
    for path in sorted((ROOT / "polycast").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in NOT_MEASURED:
            continue
        for name, doc in _docstrings(path):
            lines = doc.splitlines()
            for i, line in enumerate(lines):       # a figure with a measurement beside it
                near = " ".join(lines[max(0, i - 1):i + 2])
                if FIGURE.search(line) and MEASURED.search(near):
                    found.append(f"{rel}:{name}: {line.strip()!r}")
    assert not found, ("measured figures in docstrings (move them to docs/benchmarks.md via "
                       "bench/keep.py): " + "; ".join(found))
