"""No call may poison the next (issue 10), on real processes: a bad call raises a clear
polycast error on EVERY rank, and the next good call returns the right data promptly.
The rank program is tests/comm_poison.py; one group of 3 ranks runs every case."""

from __future__ import annotations

import json

import pytest

from test_runtime_helpers import spawn_ranks

P = 3


@pytest.fixture(scope="module", params=["shm", "tcp"])
def cases(request):
    results = spawn_ranks(P, ["tests/comm_poison.py"],
                          env={"POLYCAST_TIMEOUT": "20", "POLYCAST_TRANSPORT": request.param},
                          timeout=150)
    per_rank = []
    for res in results:
        assert res.returncode == 0, f"rank {res.rank}\n{res.out[-3000:]}\n{res.err[-3000:]}"
        got = {}
        for line in res.out.splitlines():
            if line.startswith("CASE "):
                c = json.loads(line[5:])
                got[c["name"]] = c
        per_rank.append(got)
    return per_rank


def _errors(cases, name):
    return [c[name]["error"] for c in cases]


def _next_ok(cases, name, seconds=5.0):
    for r, c in enumerate(cases):
        nxt = c[name]["next"]
        assert nxt["ok"], f"rank {r}: the call after {name} failed: {nxt['error']}"
        assert nxt["seconds"] < seconds, f"rank {r}: next call took {nxt['seconds']:.1f} s"
    return [c[name]["next"]["value"] for c in cases]


def _allreduce_ok(cases, name):
    want = [float(sum(range(1, P + 1)))] * 4
    assert _next_ok(cases, name) == [want] * P


def test_gather_with_a_small_root_recvbuf_fails_everywhere_and_leaves_nothing(cases):
    errs = _errors(cases, "gather_small_root_recvbuf")
    assert all(e and e[0] == "InvalidArgument" for e in errs), errs
    assert "recvbuf needs" in errs[0][1]
    assert all("rank 0" in e[1] and "recvbuf needs" in e[1] for e in errs[1:]), errs
    # not the stale [r, r] pairs of the refused call
    assert _next_ok(cases, "gather_small_root_recvbuf")[0] == [10, 11, 12]


@pytest.mark.parametrize("algo", ["binomial", "auto"])
def test_bcast_with_a_bad_root_buffer_fails_everywhere(cases, algo):
    name = f"bcast_bad_root_buf_{algo}"
    errs = _errors(cases, name)
    assert all(e is not None for e in errs), errs
    assert errs[0][0] == "InvalidArgument" and "contiguous" in errs[0][1]
    assert all("rank 0" in e[1] or "ranks [0]" in e[1] for e in errs[1:]), errs
    assert _next_ok(cases, name) == [[0.0] * 4] * P


def test_explicit_algorithm_errors_are_clear_and_leave_the_communicator_working(cases):
    for name in ("avg_of_bool_ring", "readonly_recvbuf_ring"):
        errs = _errors(cases, name)
        assert all(e and e[0] == "InvalidArgument" for e in errs), (name, errs)
        _allreduce_ok(cases, name)
    assert "avg cannot combine bool" in _errors(cases, "avg_of_bool_ring")[0][1]
    assert "read-only" in _errors(cases, "readonly_recvbuf_ring")[0][1]


def test_a_memory_error_in_the_progress_thread_fails_the_request_not_the_thread(cases):
    errs = _errors(cases, "readonly_past_the_checks")
    assert all(e and e[0] == "InvalidArgument" for e in errs), errs
    assert all("read-only" in e[1] for e in errs), errs
    _allreduce_ok(cases, "readonly_past_the_checks")


def test_aliased_buffers_are_in_place(cases):
    for algo in ("ring", "recdoubling", "binomial", "rabenseifner", "dbtree"):
        want = [float(P * i + sum(range(P))) for i in range(8)]
        assert _next_ok(cases, f"alias_allreduce_{algo}") == [want] * P, algo
    for algo in ("pairwise", "bruck"):
        got = _next_ok(cases, f"alias_alltoall_{algo}")
        for r in range(P):
            want = [100 * p + 3 * r + i for p in range(P) for i in range(3)]
            assert got[r] == want, (algo, r)
    errs = _errors(cases, "overlap_allreduce")
    assert all(e and e[0] == "InvalidArgument" and "overlap" in e[1] for e in errs), errs
    _allreduce_ok(cases, "overlap_allreduce")


def test_object_arrays_are_a_clear_error_on_every_rank(cases):
    errs = _errors(cases, "object_dtype_one_rank")
    assert errs[P - 1][0] == "InvalidArgument" and "lowercase methods" in errs[P - 1][1]
    # The others name the rank (on one host the call takes symmetric memory, which
    # reports a rank that could not take part as a MismatchError).
    assert all(e and e[0] in ("InvalidArgument", "MismatchError") and f"{P - 1}" in e[1]
               for e in errs[:-1]), errs
    _allreduce_ok(cases, "object_dtype_one_rank")


def test_mismatch_errors_name_both_calls(cases):
    errs = _errors(cases, "mismatch_names_both")
    assert all(e and e[0] == "MismatchError" for e in errs), errs
    assert all("allgather" in e[1] and "allreduce" in e[1] for e in errs), errs
    _allreduce_ok(cases, "mismatch_names_both")
