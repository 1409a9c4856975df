"""PyTorch's own distributed test suite against polycast (3 ranks, torch 2.13.0 CPU).

tests/torch_suite.py runs ``DistributedTest._DistTestBase`` — the class PyTorch's
test/distributed/test_distributed_spawn.py runs for gloo — against a backend and writes
every test's outcome. Here:

* polycast: every test passes except those in tests/torch_suite_expected.py, each of
  which must end exactly as listed there (a test that starts passing, or a new failure
  or skip, fails this test: update the list with its reason);
* gloo, in the same place: no test on that list passes on gloo, except the ones listed
  as gloo-only APIs of torch (GLOO_ONLY: torch itself refuses every other backend).

Slow (each run forks 3 ranks for ~150 tests: 3-5 minutes a backend on 2 busy cores).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from torch_helpers import ROOT, env, needs_torch

pytestmark = [needs_torch, pytest.mark.slow]

try:
    import expecttest  # noqa: F401  (torch's test utilities import it)
    HAVE_EXPECTTEST = True
except ImportError:
    HAVE_EXPECTTEST = False
needs_expecttest = pytest.mark.skipif(
    not HAVE_EXPECTTEST, reason="torch's test utilities need expecttest (pip install "
    "'polycast[test]')")


def _run_suite(backend: str, tmp_path) -> dict:
    out = tmp_path / f"{backend}.json"
    e = env()
    # The suite gives every group its timeout (60 s; 1 s where it tests timeouts), which
    # POLYCAST_TIMEOUT would override.
    e.pop("POLYCAST_TIMEOUT", None)
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "torch_suite.py"),
                           "--backend", backend, "--world-size", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=1500, cwd=ROOT, env=e)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(out.read_text())


@needs_expecttest
def test_polycast_passes_pytorchs_suite_but_the_listed(tmp_path):
    from torch_suite_expected import EXPECTED, WHY
    got = _run_suite("polycast", tmp_path)
    tests = got["tests"]
    assert len(tests) > 250, got["counts"]          # the whole class ran
    wrong = []
    for name, res in sorted(tests.items()):
        want = EXPECTED.get(name, ("passed", None))[0]
        if res["outcome"] != want:
            wrong.append(f"{name}: {res['outcome']} (listed: {want}) "
                         f"{res['detail'][-600:]}")
    missing = sorted(set(EXPECTED) - set(tests))
    assert not wrong and not missing, "\n".join(wrong + [f"{m}: listed, not in torch's "
                                                          "suite" for m in missing])
    for name, (outcome, why) in EXPECTED.items():
        assert why in WHY, (name, why)


@needs_expecttest
def test_no_listed_test_passes_on_gloo(tmp_path):
    from torch_suite_expected import EXPECTED, GLOO_ONLY
    got = _run_suite("gloo", tmp_path)
    passed = {n for n, r in got["tests"].items() if r["outcome"] == "passed"}
    assert len(passed) > 60, got["counts"]
    on_list = sorted(n for n in EXPECTED if n in passed and n not in GLOO_ONLY)
    assert not on_list, f"gloo passes these, polycast should too: {on_list}"
    # Conversely: what gloo does not pass here, we do not claim to pass either way.
    assert GLOO_ONLY <= passed, sorted(GLOO_ONLY - passed)
