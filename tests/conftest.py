"""Test-suite options shared by every test file.

* ``slow`` tests (external suites, soaks, lab runs, anything over ~10 s) are left out of the
  README's command ``python -m pytest -q``; ``--slow`` runs them too (everything), and
  ``-m slow`` runs only them (as ``.ci/run``'s slow set does). See docs/testing.md.
* ``root`` tests skip, saying so, when not run as root.
* polycast's bytecode is compiled once per session: the tests start rank processes by the
  hundred, and where PYTHONDONTWRITEBYTECODE is set (as on CI) each would otherwise compile
  every polycast module from source again (about a third of an import's CPU time).
"""

from __future__ import annotations

import compileall
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    for folder in ("polycast", "tests"):
        compileall.compile_dir(str(ROOT / folder), quiet=2, workers=1)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the tests marked slow (everything; the README's command "
                          "leaves them out)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not (config.getoption("--slow") or "slow" in (config.getoption("markexpr") or "")):
        slow = [it for it in items if it.get_closest_marker("slow") is not None]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [it for it in items if it.get_closest_marker("slow") is None]
    if os.geteuid() != 0:
        why = pytest.mark.skip(reason="needs root (network namespaces, tc): run as root")
        for it in items:
            if it.get_closest_marker("root") is not None:
                it.add_marker(why)
