"""The layers of DESIGN.md as import-linter contracts (pyproject.toml): an import that goes
up a layer, or a circle between sibling modules, fails the build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("importlinter", reason="import-linter is not installed (pip install "
                    "'.[test]' installs it): the layer contracts cannot be checked")

_LINT = "import sys; from importlinter.cli import lint_imports_command; " \
        "sys.exit(lint_imports_command())"


def _lint(tree: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the polycast package in ``tree`` (found first on the path)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    return subprocess.run([sys.executable, "-c", _LINT, "--no-cache"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=600)


def test_imports_only_go_down():
    got = _lint(ROOT)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "0 broken" in got.stdout


@pytest.mark.slow
def test_an_upward_import_breaks_the_contracts(tmp_path):
    """The check can fail: the engine importing the CLI is refused."""
    shutil.copytree(ROOT / "polycast", tmp_path / "polycast",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c", "*.h"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    wire = tmp_path / "polycast" / "engine" / "wire.py"
    wire.write_text(wire.read_text() + "\nfrom ..cli import main  # noqa: E402,F401\n")
    got = _lint(tmp_path)
    assert got.returncode != 0
    assert "polycast.engine is not allowed to import polycast.cli" in got.stdout, got.stdout
