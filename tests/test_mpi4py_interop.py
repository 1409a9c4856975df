"""mpi4py's own collective tests (test_cco_*.py from the mpi4py 4.1.2 source distribution)
run against polycast's Comm through a stand-in ``mpi4py.MPI`` (tests/mpi4py_shim,
rank program tests/mpi4py_interop.py), on 3 and 4 ranks.

Every test must pass, except the ones that need what polycast declines (MPI derived
datatypes: ``Create_indexed_block``, ``Alltoallw`` with datatype extents, ``MPI.BOTTOM`` /
``Get_address``); those are listed with their reason. mpi4py's point-to-point tests are
not run here yet: see the module's NOT_RUN.

The source distribution is taken from POLYCAST_MPI4PY_SRC (its test/ folder's parent), else
~/.cache/polycast-mpi4py/mpi4py-4.1.2, else fetched there with ``pip download --no-deps
--no-binary :all: mpi4py==4.1.2`` (a few minutes once); the test skips, saying so, when
none of that works (no network to PyPI).
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import subprocess
import sys
import tarfile

import pytest

from test_runtime_helpers import spawn_ranks

VERSION = "4.1.2"
CACHE = pathlib.Path.home() / ".cache" / "polycast-mpi4py"
# What needs MPI derived datatypes (declined: polycast takes numpy dtypes).
DECLINED = ("Create_indexed_block", "'extent'", "Get_address", "BOTTOM")
NOT_RUN = {
    # test_p2p_buf and test_p2p_obj together: 67 of 144 pass (measured by hand, 3 ranks).
    "test_p2p_buf": "null Prequest()/Request() constructors, Cancel and Alloc_mem are "
                    "missing; some Waitsome/Testsome cases time out (not diagnosed)",
    "test_p2p_obj": "as test_p2p_buf",
}


def _source() -> pathlib.Path:
    env = os.environ.get("POLYCAST_MPI4PY_SRC")
    if env:
        return pathlib.Path(env)
    src = CACHE / f"mpi4py-{VERSION}"
    if (src / "test" / "test_cco_buf.py").exists():
        return src
    CACHE.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                        ":all:", f"mpi4py=={VERSION}", "-d", str(CACHE)],
                       check=True, capture_output=True, timeout=600)
        with tarfile.open(CACHE / f"mpi4py-{VERSION}.tar.gz") as tar:
            tar.extractall(CACHE, filter="data")
    except Exception as exc:       # no network, no pip: say why
        pytest.skip(f"mpi4py {VERSION} source distribution unavailable ({exc!r:.200}); set "
                    "POLYCAST_MPI4PY_SRC to an unpacked copy")
    return src


@pytest.fixture(scope="module")
def mpi4py_tests() -> str:
    return str(_source() / "test")


def _run(nranks: int, test_dir: str, modules: list[str]) -> dict:
    results = spawn_ranks(nranks, ["tests/mpi4py_interop.py", test_dir, *modules],
                          env={"POLYCAST_TIMEOUT": "20"}, timeout=400)
    outcomes = {}
    for res in results:
        line = [x for x in res.out.splitlines() if x.startswith("INTEROP ")]
        assert res.returncode == 0 and line, f"rank {res.rank}\n{res.err[-3000:]}"
        outcomes[res.rank] = json.loads(line[0][len("INTEROP "):])["tests"]
    return outcomes


@pytest.mark.parametrize("nranks,modules", [
    (3, ["test_cco_buf", "test_cco_vec", "test_cco_obj", "test_cco_nb_buf", "test_cco_nb_vec",
         "test_cco_pr_buf", "test_cco_pr_vec"]),
    (4, ["test_cco_vec", "test_cco_obj", "test_cco_nb_buf"]),
])
def test_mpi4py_collective_tests_pass(mpi4py_tests, nranks, modules):
    outcomes = _run(nranks, mpi4py_tests, modules)
    for rank, tests in outcomes.items():
        counts = collections.Counter(kind for kind, _ in tests.values())
        declined = {t: why for t, (kind, why) in tests.items()
                    if kind == "error" and any(d in why for d in DECLINED)}
        bad = {t: (kind, why) for t, (kind, why) in tests.items()
               if kind in ("fail", "error") and t not in declined}
        print(f"rank {rank}: {dict(counts)}; declined (derived datatypes): {len(declined)}")
        assert not bad, f"rank {rank}: {len(bad)} failing: " + "\n".join(
            f"{t}: {kind} {why}" for t, (kind, why) in sorted(bad.items())[:20])
        assert counts["ok"] > 100, counts
