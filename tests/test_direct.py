"""The direct path of repeated small blocking collectives (runtime/driver/direct.py,
CommCore._direct_keep, the blocking forms in comm/collectives.py): once the compiled replay
ran a call whole, the next calls of its shape go from the comm layer straight into the
replay. Real ranks on the engine path (POLYCAST_SYMM=0, shm); every call's data is new and
every rank checks every result with numpy (tests/direct_rank.py)."""

from __future__ import annotations

import os

import pytest

from polycast.runtime.driver import replay

from test_runtime_helpers import rank_results, spawn_ranks

pytestmark = pytest.mark.skipif(replay.unavailable_reason() is not None,
                                reason=f"no compiled replay, so no direct path: "
                                       f"{replay.unavailable_reason()}")
WORKER = os.path.join(os.path.dirname(__file__), "direct_rank.py")


def _ranks(nranks, mode, tmp, env=None, timeout=120, victim=None):
    """Every rank's RESULT (its stderr under "_stderr"); the victim must exit with 17."""
    e = {"POLYCAST_SYMM": "0", "POLYCAST_TRANSPORT": "shm", "POLYCAST_TIMEOUT": "20",
         "DIRECT_DIR": str(tmp)}
    e.update(env or {})
    results = spawn_ranks(nranks, [WORKER, mode], env=e, timeout=timeout)
    return rank_results(results, victim, exit_ok=True, stderr=True)


def _launch(tmp_path_factory, nranks, mode, **kw):
    return _ranks(nranks, mode, tmp_path_factory.mktemp(mode), **kw)


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    return _launch(tmp_path_factory, 4, "counted")


@pytest.fixture(scope="module")
def unfitting(tmp_path_factory):
    return _launch(tmp_path_factory, 3, "args")


# -- 1, 2: counted use and right results -------------------------------------------------
EXPLICIT = ["ar-f32-sum-recdoubling", "ar-i64-max-recdoubling", "ar-i64-min-ring",
            "ar-f64-prod-binomial", "ar-i32-sum-wrap-recdoubling", "ag-f32-recdoubling",
            "ag-i64-ring", "rs-f32-sum-ring", "rs-i64-sum-rechalving",
            "bc-f64-root1-binomial", "bc-i32-root1-chain", "barrier-dissemination"]
AUTO = ["auto-ar-f32-sum", "auto-ag-i64", "auto-rs-f32-sum", "auto-bc-f32-root1",
        "auto-barrier"]


def _check_counted(counted, names):
    for rank, res in enumerate(counted):
        assert res["bad"] == [], (rank, res["bad"][:5])         # every call's result right
        for name in names:
            c = res["cases"][name]
            # The first call takes the full path; the DirectCall takes the rest, run whole
            # or (a peer late by more than the wait bound: a loaded machine) adopted. After
            # an adoption the engine's own output can make a few calls take the full path,
            # so on a heavily loaded machine the share taken drops (quiet: all but the
            # first); never to none.
            assert c["kept"] >= 1 and c["whole"] + c["adopted"] >= c["calls"] // 4, \
                (rank, name, c)
            assert c["whole"] >= 1, (rank, name, c)
            assert c["whole"] + c["adopted"] <= c["calls"], (rank, name, c)


def test_repeated_blocking_calls_go_direct_and_are_right(counted):
    """Allreduce (float32 sum, int64 max and min, float64 prod, int32 sum that wraps),
    Allgather, Reduce_scatter_block, Bcast from root 1 and Barrier (each rank's file made
    before the barrier is there after it), explicit algorithms, new data every call."""
    assert len(counted) == 4
    _check_counted(counted, EXPLICIT)


@pytest.fixture(scope="module")
def counted_nonblocking(tmp_path_factory):
    return _launch(tmp_path_factory, 4, "counted", env={"DIRECT_NONBLOCKING": "1"})


def test_nonblocking_calls_go_direct_and_are_right(counted_nonblocking):
    """The same cases as I-variants then Wait: the I-variant takes the kept DirectCall too
    and returns a finished Request (Wait and Test say so, a second Wait returns at once)."""
    assert len(counted_nonblocking) == 4
    _check_counted(counted_nonblocking, EXPLICIT + AUTO)


def test_auto_without_symmetric_memory_goes_direct(counted):
    """algorithm=None with POLYCAST_SYMM=0: the planner's engine schedule, kept as well."""
    _check_counted(counted, AUTO)


# -- 3: arguments that do not fit what is kept -------------------------------------------
def test_arguments_that_do_not_fit_take_the_full_path_and_are_right(unfitting):
    """Another size, another dtype, IN_PLACE, Allreduce(x, x), Fortran-ordered 2-D: the
    kept DirectCall does not run them, they are right, and so are the next calls; a 2-D
    C-ordered array of the kept count and a read-only sendbuf fit and go direct."""
    for rank, res in enumerate(unfitting):
        assert res["bad"] == [], (rank, res["bad"][:5])
        st = res["steps"]
        for name in ("other_size", "other_dtype", "in_place", "aliased", "fortran"):
            s = st[name]
            assert s["got"] == "ok" and s["after"] == "ok" and s["bad"] == [], (rank, name, s)
            assert s["kept_before"] > 0, (rank, name, s)       # warm calls went direct
            assert s["direct"] == 0 and s["adopted"] == 0, (rank, name, s)
        for name in ("two_d", "read_only_send"):
            s = st[name]
            assert s["got"] == "ok" and s["after"] == "ok" and s["bad"] == [], (rank, name, s)
            assert s["direct"] + s["adopted"] >= 2, (rank, name, s)     # of 3 calls


def test_an_argument_one_rank_refuses_fails_the_call_on_every_rank(unfitting):
    """Rank 1 alone passes a read-only recvbuf, a non-contiguous sendbuf, or overlapping
    send and recv, while the others' calls fit the kept DirectCall: rank 1 raises its
    InvalidArgument, the others raise InvalidArgument naming rank 1 (the call they began
    direct is finished by the engine), and every rank's next calls are right. The same
    for Bcast from root 1 with a read-only buffer on rank 2 (the root raises too)."""
    why = {"read_only_recv_one_rank": "recvbuf is read-only",
           "non_contiguous_one_rank": "sendbuf must be contiguous",
           "overlap_one_rank": "sendbuf and recvbuf overlap"}
    for rank, res in enumerate(unfitting):
        st = res["steps"]
        for name, text in why.items():
            s = st[name]
            assert s["got"].startswith("InvalidArgument: "), (rank, name, s)
            if rank == 1:
                assert text in s["got"] and s["direct"] == 0, (rank, name, s)
            else:
                assert "rank 1" in s["got"] and text in s["got"], (rank, name, s)
                assert s["direct"] == 0, (rank, name, s)   # not counted as a whole call
            assert s["after"] == "ok" and s["bad"] == [], (rank, name, s)
        s = st["bcast_read_only_rank2"]
        assert s["got"].startswith("InvalidArgument: ") and "read-only" in s["got"], (rank, s)
        if rank != 2:
            assert "rank 2" in s["got"], (rank, s)
        assert s["kept_before"] > 0 and s["direct"] == 0, (rank, s)
        assert s["after"] == "ok" and s["bad"] == [], (rank, s)


def test_arguments_every_rank_refuses_raise_invalid_argument_everywhere(unfitting):
    """A read-only recvbuf, a non-contiguous sendbuf (x[::2]), partly overlapping views
    of one array (Allreduce; Allgather with another rank's block of recvbuf as sendbuf)
    on every rank: InvalidArgument on every rank, nothing run direct, next calls right."""
    why = {"read_only_recv_every_rank": "recvbuf is read-only",
           "non_contiguous_every_rank": "sendbuf must be contiguous",
           "overlap_every_rank": "sendbuf and recvbuf overlap",
           "allgather_overlap": "sendbuf and recvbuf overlap"}
    for rank, res in enumerate(unfitting):
        for name, text in why.items():
            s = res["steps"][name]
            assert s["got"].startswith("InvalidArgument: ") and text in s["got"], \
                (rank, name, s)
            assert s["kept_before"] > 0, (rank, name, s)
            assert s["direct"] == 0 and s["adopted"] == 0, (rank, name, s)
            assert s["after"] == "ok" and s["bad"] == [], (rank, name, s)


def test_calls_the_kept_one_cannot_take_do_not_pile_up_copies_of_it(tmp_path):
    """Allreduce(z, z) (aliased: the full path's, as IN_PLACE) and Fortran-ordered 2-D
    arrays of the kept count: the helper refuses them every time, the full path's replay
    runs them whole. They must not keep another DirectCall of the same shape per call:
    the copies are never usable and push the key's other shapes (4 at most) out."""
    for rank, res in enumerate(_ranks(2, "kept", tmp_path)):
        assert res["bad"] == [], (rank, res["bad"])
        assert res["before"] == [[6, 6, "float32"]], (rank, res)
        assert res["orig_still_kept"] and res["after"] == res["before"], (rank, res)


# -- 4: the settings are the communicator's ---------------------------------------------
def test_a_variable_set_later_changes_nothing_for_kept_calls(tmp_path):
    """POLYCAST_NCHUNKS=2, POLYCAST_DEBUG=TRACE or INFO, POLYCAST_ALLREDUCE_ALGO=ring (with
    an explicit algorithm and with auto), POLYCAST_SYMM=1 (auto), set on every rank after
    the communicator was made: its settings were read then, so the DirectCall that ran the
    calls before runs every one of them (nothing logged) and the results are right. A
    communicator made with POLYCAST_DEBUG=TRACE logs every call and keeps none."""
    got = _ranks(2, "env", tmp_path)
    for rank, res in enumerate(got):
        assert res["bad"] == [], (rank, res["bad"][:5])
        phases = dict(res["phases"])
        traced = phases.pop("traced_comm")
        for name, ph in phases.items():
            assert ph["kept_before"] is not None and ph["kept_before"] > 0, (rank, name, ph)
            assert ph["while_set"] == ph["calls"], (rank, name, ph)
            assert ph["after_unset"] == ph["calls"], (rank, name, ph)
        err = res["_stderr"]
        for name in ("debug_trace", "debug_info"):
            part = err[err.index(f"PHASE {name} begin"):err.index(f"PHASE {name} end")]
            assert "polycast" not in part.replace(f"PHASE {name}", ""), part
        trace = err[err.index("PHASE traced_comm begin"):err.index("PHASE traced_comm end")]
        logged = [ln for ln in trace.splitlines() if "polycast" in ln and "allreduce" in ln]
        assert len(logged) == traced["calls"] and traced["kept"] == 0, (trace, traced)


# -- 5: mismatch ---------------------------------------------------------------------------
def test_a_mismatch_after_direct_calls_raises_on_every_rank(tmp_path):
    got = _ranks(3, "mismatch", tmp_path)
    for rank, res in enumerate(got):
        assert res["warm_whole"] > 0, (rank, res)
        assert res["raised"].startswith("MismatchError"), (rank, res)
        assert res["seconds"] < 15, (rank, res)                 # not the timeout
        assert res["after"] == "ok" and res["after_bad"] == [] and res["bad"] == [], \
            (rank, res)
        assert res["after_whole"] > 0, (rank, res)              # direct again after it


# -- 6: adoption ---------------------------------------------------------------------------
@pytest.mark.parametrize("nonblocking", [False, True], ids=["blocking", "nonblocking"])
def test_a_direct_call_stopped_part_way_is_finished_by_the_engine(tmp_path, nonblocking):
    """The replay's step limit 1, 2, 3 on every rank: Allreduce, Allgather,
    Reduce_scatter_block, Bcast (root 1) and Barrier calls begun by a DirectCall and
    adopted by the engine are right; with the limit off they go direct again. As
    I-variants, the adopted call's Request is returned pending and Wait finishes it."""
    got = _ranks(4, "adopt", tmp_path, env={"DIRECT_NONBLOCKING": "1" if nonblocking else "0"})
    for rank, res in enumerate(got):
        assert res["bad"] == [], (rank, res["bad"][:5])
        assert all(v > 0 for v in res["kept_before"].values()), (rank, res["kept_before"])
        for limit, per in res["limits"].items():
            assert per["bad"] == [], (rank, limit, per["bad"][:5])
            # recursive doubling on 4 ranks: 5 steps on every rank, so always stopped
            assert per["allreduce"]["adopted"] >= 3, (rank, limit, per)
            for name in ("allreduce", "allgather", "reduce_scatter", "bcast", "barrier"):
                if name == "barrier" and int(limit) >= 3:
                    # its program is SEND RECV SEND RECV: the limit stops a run only before a
                    # SEND or COPY, so a last RECV whose frame came early still completes it
                    continue
                assert per[name]["whole"] == 0, (rank, limit, name, per)
            assert sum(per[n]["adopted"] for n in per if n != "bad") >= 10, (rank, limit, per)
        assert all(v >= 1 for v in res["whole_after"].values()), (rank, res["whole_after"])
    for name in ("allgather", "reduce_scatter", "bcast", "barrier"):
        assert sum(res["limits"][lim][name]["adopted"] for res in got
                   for lim in res["limits"]) > 0, name


# -- 7: a dead peer ------------------------------------------------------------------------
def test_a_dead_peer_during_direct_calls_raises_peer_lost(tmp_path):
    got = _ranks(3, "death", tmp_path, env={"POLYCAST_TIMEOUT": "10"}, victim=2)
    assert len(got) == 2
    for rank, res in enumerate(got):
        assert res["warm_whole"] > 0, (rank, res)
        assert res["bad"] == [], (rank, res["bad"][:5])
        assert res["raised"].startswith("PeerLost") and "rank 2" in res["raised"], (rank, res)
        assert res["seconds"] < 10, (rank, res)


# -- 8: Dup and Free -----------------------------------------------------------------------
def test_a_dup_keeps_its_own_direct_calls_and_free_drops_them(tmp_path):
    got = _ranks(2, "dup", tmp_path)
    for rank, res in enumerate(got):
        assert res["bad"] == [], (rank, res["bad"][:5])
        assert res["dup_id"] != res["world_id"]
        # the Dup's calls run on its own DirectCall, for its own communicator (counts are
        # the calls a DirectCall took: run whole, or begun there and adopted)
        assert res["dup_whole"] >= 3 and res["world_whole_while_dup"] == 0, (rank, res)
        assert set(res["dup_kept_cs"]) == {res["dup_id"]}, (rank, res)
        assert set(res["world_kept_cs"]) == {res["world_id"]}, (rank, res)
        assert not res["shared"], (rank, res)
        assert res["interleaved"][0] >= 3 and res["interleaved"][1] >= 3, (rank, res)
        # Free drops them; a call on the freed Dup is refused, the world's go on direct
        assert res["dup_direct_after_free"] == 0, (rank, res)
        assert res["call_after_free"].startswith("InvalidArgument") \
            and "freed" in res["call_after_free"], (rank, res)
        assert res["world_after_free"] >= 3, (rank, res)
        assert res["dup2_direct_new"] == 0 and res["dup2_whole"] >= 3, (rank, res)
        assert res["dup2_direct_after_free"] == 0, (rank, res)


def test_direct_calls_among_outstanding_requests_and_threads(tmp_path):
    """Direct calls while a large Iallreduce, a point-to-point message or a small
    Iallreduce is outstanding keep their order (every result right); two threads calling
    on the world communicator and on a Dup at once each get their own direct calls."""
    got = _ranks(2, "mixed", tmp_path)
    for rank, res in enumerate(got):
        assert res["bad"] == [], (rank, res["bad"][:5])
        assert res["direct_while_others"] > 0, (rank, res)
        assert res["threads_alive"] == [False, False] and res["thread_errors"] == [], \
            (rank, res)
        assert min(res["threads_direct"]) >= 50, (rank, res)     # of 150 calls each


def test_a_late_rank_goes_direct_with_zero_length_frames_held_early(tmp_path):
    """Rank 1 sleeps 50 ms before a call, so its peers' frames of that call are held early
    by its engine when it calls; replay_begin hands them to the helper. Allreduce (no
    zero-length frame): the late rank's call runs direct. Barrier (dissemination: every
    frame zero-length) and Bcast from root 0 (its entry barrier's frames are zero-length)
    must as well: a zero-length frame is held with payload None, which the helper cannot
    take (``PyObject_GetBuffer(None)``: TypeError, caught in Replayer.replay: "nothing
    done"), so the late rank's call takes the engine's path, where it is late again."""
    got = _ranks(3, "late", tmp_path)
    for rank, res in enumerate(got):
        assert res["bad"] == [], (rank, res["bad"][:5])
    late = got[1]["late"]
    for name in ("allreduce", "barrier", "bcast"):
        direct = sum(w for w, _ in late[name])
        assert direct >= len(late[name]) - 2, (name, late)
