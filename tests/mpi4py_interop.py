"""A rank program for tests/test_mpi4py_interop.py: mpi4py's own test files (argv[1]: the
test/ folder of mpi4py's source distribution; argv[2:]: module names) run with unittest
against polycast behind a stand-in ``mpi4py.MPI`` (tests/mpi4py_shim). Prints one line
"INTEROP <json>": each test's id and outcome (ok, fail, error, skip) with a short reason."""
import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "mpi4py_shim"))
sys.path.insert(1, sys.argv[1])

from mpi4py import MPI  # noqa: E402  (the shim: polycast.init() happens here)
import arrayimpl  # noqa: E402  (mpi4py's test array backends)

# Keep mpi4py's host-memory test backends ("array", "numpy"). Its "dlpack-*" backends hand
# out capsules made with ctypes (test/dlpackimpl.py) whose deleter crashes the process once
# numpy.from_dlpack has taken them (a segfault in dl_managed_tensor_deleter); its device
# backends (cupy, numba, "*-cuda") need a GPU, and polycast moves host memory only.
# (The fake-GPU ones present a "CUDA" device on host memory: declined the same way.)
HOST = ("ArrayArray", "ArrayNumPy")
SKIPPED_BACKENDS = [b.__name__ for b in arrayimpl.ArrayBackends if b.__name__ not in HOST]
arrayimpl.ArrayBackends[:] = [b for b in arrayimpl.ArrayBackends if b.__name__ in HOST]


class Collect(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.rows = []

    def startTest(self, test):
        super().startTest(test)
        print(f"start {test.id()}", file=sys.stderr, flush=True)     # where a hang is

    def addSuccess(self, test):
        self.rows.append((test.id(), "ok", ""))

    def addFailure(self, test, err):
        self.rows.append((test.id(), "fail", f"{err[0].__name__}: {str(err[1])[:300]}"))

    def addError(self, test, err):
        self.rows.append((test.id(), "error", f"{err[0].__name__}: {str(err[1])[:300]}"))

    def addSkip(self, test, reason):
        self.rows.append((test.id(), "skip", reason[:200]))

    def addSubTest(self, test, subtest, err):
        if err is not None:
            kind = "fail" if issubclass(err[0], test.failureException) else "error"
            self.rows.append((test.id(), kind, f"{err[0].__name__}: {str(err[1])[:300]}"))


suite = unittest.TestSuite()
loader = unittest.TestLoader()
for name in sys.argv[2:]:
    suite.addTests(loader.loadTestsFromName(name))
result = Collect()
suite.run(result)
# A test with a failing subtest is reported once, as its worst outcome.
worst = {}
order = {"ok": 0, "skip": 1, "fail": 2, "error": 3}
for tid, kind, why in result.rows:
    if tid not in worst or order[kind] > order[worst[tid][0]]:
        worst[tid] = (kind, why)
print("INTEROP " + json.dumps({"rank": MPI.COMM_WORLD.rank, "tests": worst,
                               "backends_skipped": SKIPPED_BACKENDS}), flush=True)
import polycast  # noqa: E402
polycast.finalize()
