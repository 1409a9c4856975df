"""A datagram helper built before a change to its functions is not called: _dgram.c exports
the interface version of _dgram_abi.h it was built from (``_dgram.ABI``), dgram.py reads the
header as it is now, and a helper whose number differs or is missing is refused at load
(runtime/transport/native.load), the Python datagram path running instead and
POLYCAST_DEBUG=INFO saying why. These run whether or not the helper is built."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from polycast.runtime.transport import dgram, layout, native

NAME = "polycast.runtime.transport._dgram"

# A rank program that installs a stale helper (an old interface number, and functions that
# end the rank if anything calls them) before polycast loads it, then runs every multicast
# collective of the selftest.
STALE_RANK = f"""
import sys, types
stale = types.ModuleType({NAME!r})
def called(*args, **kwargs):
    raise SystemExit("the stale datagram helper was called")
stale.Placer = stale.send = stale.send_chunks = stale.mac = stale.gso_available = called
stale.ABI = {dgram.ABI - 1}
sys.modules[stale.__name__] = stale
from polycast.tools import selftest
sys.exit(selftest.main(["--suite", "mcast"]))
"""


def test_the_version_is_the_headers():
    header = os.path.join(os.path.dirname(dgram.__file__), "_dgram_abi.h")
    assert dgram.ABI == layout.read_defines(header)["DGRAM_ABI"] >= 1


@pytest.mark.parametrize("built", ["other", "missing", "same"])
def test_the_loader_refuses_a_helper_of_another_interface(monkeypatch, built):
    fake = types.ModuleType("polycast_test_stale_helper")
    if built != "missing":
        fake.ABI = dgram.ABI + (built == "other")
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    module, why_not = native.load(fake.__name__, "the datagram helper", abi=dgram.ABI)
    if built == "same":
        assert module is fake and why_not is None
    else:
        assert module is None
        shown = "unversioned" if built == "missing" else str(dgram.ABI + 1)
        assert f"the built helper's interface is {shown}, its source's is {dgram.ABI}" \
            in why_not and "rebuild" in why_not


@pytest.mark.skipif(not dgram.available(),
                    reason=f"the datagram helper is not built: {dgram.why_not}")
def test_the_built_helper_is_refused_by_a_source_of_another_interface():
    assert dgram._dgram.ABI == dgram.ABI
    module, why_not = native.load(NAME, "the datagram helper", abi=dgram.ABI + 1)
    assert module is None and f"interface is {dgram.ABI}, its source's is {dgram.ABI + 1}" \
        in why_not


def test_a_stale_helper_is_not_called_and_multicast_runs_the_python_path(tmp_path):
    script = tmp_path / "stale_rank.py"
    script.write_text(STALE_RANK)
    env = dict(os.environ, POLYCAST_DEBUG="INFO")
    env.pop("POLYCAST_TEST_HOOKS", None)   # (dgram=0 would keep the helper unused anyway)
    p = subprocess.run([sys.executable, "-m", "polycast.cli.main", "run", "-n", "2",
                        "--timeout", "90", str(script)],
                       env=env, capture_output=True, text=True, timeout=150)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert p.stdout.count("SELFTEST mcast OK") == 2 and "mcast=yes" in p.stdout, out[-3000:]
    why = f"the built helper's interface is {dgram.ABI - 1}, its source's is {dgram.ABI}"
    assert out.count(f"multicast datagrams: Python path ({why}") == 2, out[-3000:]
    assert "stale datagram helper was called" not in out
