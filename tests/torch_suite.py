"""Run PyTorch's own distributed test suite (``DistributedTest._DistTestBase`` from
``torch/testing/_internal/distributed/distributed_test.py``, the class PyTorch's
``test/distributed/test_distributed_spawn.py`` runs for gloo) against one backend, and
write every test's outcome as JSON.

    python tests/torch_suite.py --backend polycast --world-size 3 --out outcomes.json
    python tests/torch_suite.py --backend gloo --world-size 3 --out gloo.json -k all_gather

The suite gates tests by backend name (``DistTestCases.backend_feature``). A plugin
backend declares what it has by adding its name to those sets before the suite's module
is imported (its decorators read them at import): polycast declares "ddp", "subgroup" and
"plugin" (the suite's word for "a registered third-party backend is available"), and not
"gpu"/"cuda". The runner does that here, in the parent and again in every rank process
(spawned ranks re-import this file as their main module).

Outcomes: passed, failed, error, skipped (with torch's reason), expected_failure,
unexpected_success. tests/test_torch_suite.py compares them with the expectations list.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import unittest

BACKEND_FEATURES = {"polycast": ("ddp", "subgroup", "plugin")}

# Tests the suite gates by backend *name* (gloo's, or "mpi, nccl and gloo"), though their
# bodies run on CPU with nothing gloo-specific in them: the runner lifts exactly these
# gates for polycast (only when the gate's reason is the one named here, so a torch
# that gates them otherwise is noticed) and runs the bodies unchanged.
NAME_GATES = {
    "get_future is only supported on mpi, nccl and gloo": (
        "test_get_future", "test_accumulate_gradients_no_sync",
        "test_accumulate_gradients_no_sync_allreduce_hook",
        "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
        "test_accumulate_gradients_no_sync_grad_is_view"),
    "Test requires backend {backend} to be one of {{'gloo'}}": (
        "test_all_reduce_coalesced_sum", "test_all_reduce_coalesced_max",
        "test_all_reduce_coalesced_min", "test_all_reduce_coalesced_product",
        "test_all_reduce_coalesced_full_group_sum", "test_all_reduce_coalesced_full_group_max",
        "test_all_reduce_coalesced_full_group_min",
        "test_all_reduce_coalesced_full_group_product",
        "test_all_reduce_coalesced_group_sum", "test_all_reduce_coalesced_group_max",
        "test_all_reduce_coalesced_group_min", "test_all_reduce_coalesced_group_product",
        "test_grads_same_across_ranks_with_no_sync", "test_scatter_object_list",
        # Lifted so that they reach the world-size skip gloo reaches (3 < 4): they call
        # monitored_barrier, which torch serves for gloo only (GLOO_ONLY below).
        "test_monitored_barrier_failure_order", "test_monitored_barrier_wait_all_ranks"),
    # backend_feature["gpu"]: these two run on CPU for gloo (the "gpu" set doubles as
    # "a backend torch knows"); polycast does not declare gpu.
    "Test requires backend {backend} to be one of {gpu}": (
        "test_all_gather_object_default_pg", "test_all_gather_object_subgroup"),
    "Only gloo backend supports timeouts": ("test_barrier_timeout_full_group",
                                            "test_barrier_timeout_group"),
    "GLOO Batch Send Recv CPU": ("test_batch_isend_irecv_gloo",
                                 "test_batch_isend_irecv_gloo_tags"),
    "Only Gloo backend supports sparse all reduce": ("test_sparse_all_reduce_sum",
                                                     "test_sparse_all_reduce_sum_cuda"),
}

# Of those, tests whose body picks its set-up by backend name (``if BACKEND == "mpi" or
# BACKEND == "gloo"``: a CPU model; ``if BACKEND == "nccl"``: a CUDA one) and builds
# nothing for another name (distributed_test.py:5308 in torch 2.13): polycast takes the CPU
# branch, the module's BACKEND reading "gloo" while the body runs, in the rank processes
# whose groups were made with polycast.
CPU_BRANCH = ("test_accumulate_gradients_no_sync",
              "test_accumulate_gradients_no_sync_allreduce_hook",
              "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
              "test_accumulate_gradients_no_sync_grad_is_view")


def _configure(backend: str, world_size: int) -> None:
    """What the suite's module reads at import: the backend's name, the world size, and
    the features a plugin backend declares."""
    os.environ["BACKEND"] = backend
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ.setdefault("TEMP_DIR", "/tmp")
    if backend == "polycast":
        import polycast.torch  # noqa: F401  (registers the backend)
    from torch.testing._internal.common_distributed import DistTestCases
    for feature in BACKEND_FEATURES.get(backend, ()):
        DistTestCases.backend_feature[feature].add(backend)


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default=os.environ.get("BACKEND", "polycast"))
    p.add_argument("--world-size", type=int,
                   default=int(os.environ.get("WORLD_SIZE", "3")))
    p.add_argument("--out", help="write the outcomes here (JSON)")
    p.add_argument("-k", dest="patterns", action="append", default=[],
                   help="only tests whose name contains this (repeatable)")
    p.add_argument("--tests", nargs="*", default=[], help="exactly these test names")
    return p.parse_args(argv)


if __name__ in ("__main__", "__mp_main__"):
    # In the parent: from the command line. In a spawned rank (re-imported as
    # __mp_main__): from the environment the parent set.
    _ARGS = _args([] if __name__ == "__mp_main__" else None)
    _configure(_ARGS.backend, _ARGS.world_size)

    from torch.testing._internal.distributed.distributed_test import (
        DistributedTest, TestDistBackend)

    def _lift_name_gates(cls, backend: str) -> None:
        from torch.testing._internal.common_distributed import DistTestCases
        gpu = DistTestCases.backend_feature["gpu"]
        for reason, names in NAME_GATES.items() if backend in BACKEND_FEATURES else ():
            want = reason.format(backend=backend, gpu=gpu)
            for name in names:
                fn = getattr(cls, name)
                if getattr(fn, "__unittest_skip_why__", None) == want:
                    fn.__unittest_skip__ = False
                    if name in CPU_BRANCH:
                        setattr(cls, name, _cpu_branch(fn))

    def _cpu_branch(fn):
        import functools

        from torch.testing._internal.distributed import distributed_test as suite

        @functools.wraps(fn)
        def body(self):
            saved, suite.BACKEND = suite.BACKEND, "gloo"
            try:
                return fn(self)
            finally:
                suite.BACKEND = saved
        body.__unittest_skip__ = False
        return body

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            if os.environ.get("TORCH_SUITE_START", "fork") == "spawn":
                self._spawn_processes()
            else:
                # Forked ranks start from this process, which has imported torch, the
                # suite and polycast and run nothing else: ~5 CPU-seconds less per rank
                # and test than spawn's re-import (PyTorch ran this class forked, as
                # test_distributed_fork.py, for years).
                import torch.multiprocessing as tmp
                self._start_processes(tmp.get_context("fork").Process)

    _lift_name_gates(TestDistBackendWithSpawn, _ARGS.backend)


class _Outcomes(unittest.TextTestResult):
    """Every test's outcome, its detail (skip reason, last lines of the traceback) and
    its wall seconds."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.outcomes: dict = {}
        self._t0 = 0.0

    def startTest(self, test):
        self._t0 = time.monotonic()
        super().startTest(test)

    def _put(self, test, outcome, detail=""):
        name = test.id().rsplit(".", 1)[-1]
        self.outcomes[name] = {"outcome": outcome, "detail": detail[-1500:],
                               "seconds": round(time.monotonic() - self._t0, 2)}

    def addSuccess(self, test):
        super().addSuccess(test)
        self._put(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._put(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._put(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._put(test, "skipped", str(reason))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._put(test, "expected_failure", self._exc_info_to_string(err, test))

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._put(test, "unexpected_success")


def main() -> int:
    args = _ARGS
    loader = unittest.TestLoader()
    names = loader.getTestCaseNames(TestDistBackendWithSpawn)
    if args.tests:
        names = [n for n in names if n in set(args.tests)]
    if args.patterns:
        names = [n for n in names if any(p in n for p in args.patterns)]
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    t0 = time.monotonic()
    runner = unittest.TextTestRunner(resultclass=_Outcomes, verbosity=1, stream=sys.stderr)
    result = runner.run(suite)
    seconds = time.monotonic() - t0
    counts: dict = {}
    for o in result.outcomes.values():
        counts[o["outcome"]] = counts.get(o["outcome"], 0) + 1
    doc = {"backend": args.backend, "world_size": args.world_size,
           "torch": __import__("torch").__version__, "seconds": round(seconds, 1),
           "counts": counts, "tests": result.outcomes}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
    print(json.dumps({"backend": args.backend, "seconds": round(seconds, 1),
                      "counts": counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
