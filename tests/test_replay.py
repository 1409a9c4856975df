"""The compiled replay of a memoized small call (runtime/driver/_replay.c, runtime/driver/replay.py,
engine/replay.py): its frames are the engine's, it stops on anything unexpected leaving it
unconsumed, and real ranks get the engine's results and errors with it — whole, adopted at
every step, mixed with ranks on the Python path, and with it off."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from polycast.engine.wire import MsgKind, make_header
from polycast.runtime.transport import native
from polycast.runtime.driver import replay
from polycast.runtime.transport.shm import SLEEP_FUTEX, Ring
from polycast.runtime.transport.wait import WaitPolicy

from test_runtime_helpers import rank_results, spawn_ranks

needs_replay = pytest.mark.skipif(replay.unavailable_reason() is not None,
                                  reason=f"no compiled replay: {replay.unavailable_reason()}")
WORKER = os.path.join(os.path.dirname(__file__), "replay_rank.py")
COMM, SIG, SEQ = 5, 0xA1B2C3D4, 77
SEND, RECV, COPY = 0, 1, 2


def _rings(tmp_path):
    """We are rank 0 and talk to rank 1: our in-ring (we read; the test writes as rank 1)
    and our out-ring (we write; the test reads as rank 1)."""
    cap = 1 << 16
    in_r = Ring.create(str(tmp_path / "in"), cap, native=True)
    in_w = Ring.attach(str(tmp_path / "in"), cap, native=True)
    out_r = Ring.create(str(tmp_path / "out"), cap, native=True)
    out_w = Ring.attach(str(tmp_path / "out"), cap, native=True)
    return in_r, in_w, out_r, out_w


def _plan(in_r, out_w, steps, dt=0, op=0):
    return native.ring.ReplayPlan(COMM, 0, SIG, dt, op, [(in_r._nat, out_w._nat, 1)], steps)


# A recursive-doubling allreduce of 2 float32 on 2 ranks, as rank 0: copy send -> recv,
# send recv to rank 1, receive rank 1's and add it into recv.
ALLREDUCE = [(COPY, 0, 0, 0, 0, 8, 1, 0, False, 0, 0b110),
             (SEND, 0, 0, 1, 0, 8, 0, 0, False, 1, 0),
             (RECV, 0, 0, 1, 0, 8, 0, 0, True, 1, 0)]

WAIT = WaitPolicy()                 # the default wait policy


def _peer_frame(in_w, payload: bytes, *, kind=MsgKind.DATA, sig=SIG, seq=SEQ, tag=0):
    h = make_header(kind, COMM, seq, 1, tag, 0, len(payload), sig).pack()
    assert in_w.write_now(len(h), h, [payload], len(payload)) is not None


def _run(plan, in_r, send, recv, wait_s=0.05, limit=-1):
    pos = [in_r._read_pos]
    out = plan.run(SEQ, send, recv, None, pos, (wait_s, WAIT.c_args), True, limit)
    return out, pos[0]


@needs_replay
def test_a_whole_call_writes_the_engines_frame_and_reduces_the_peers(tmp_path):
    in_r, in_w, out_r, out_w = _rings(tmp_path)
    send = np.array([1.5, -2.0], np.float32)
    recv = np.zeros(2, np.float32)
    _peer_frame(in_w, np.array([0.25, 4.0], np.float32).tobytes())
    plan = _plan(in_r, out_w, ALLREDUCE)
    (done, reason, doorbell, blocked, nsent, sent_nb, nrecv, recv_nb, *_), pos = \
        _run(plan, in_r, send, recv)
    assert replay.REASONS[reason] == "done" and done == 0b111
    assert (nsent, sent_nb, nrecv, recv_nb, doorbell, blocked) == (1, 8, 1, 8, 0, 0)
    assert recv.tolist() == (send + np.array([0.25, 4.0], np.float32)).tolist()
    in_r._read_pos = pos
    assert pos > 0 and not in_r.pending_input()           # the peer's frame consumed
    frames: list = []
    out_r.poll(frames)
    assert len(frames) == 1
    hdr_len, header, payload, _ = frames[0]
    # byte-identical to what the engine's Send would have put on the wire
    assert header == make_header(MsgKind.DATA, COMM, SEQ, 0, 0, 0, 8, SIG).pack()
    assert hdr_len == len(header) and bytes(payload) == send.tobytes()
    assert plan.counts()[:2] == (1, 1)


@needs_replay
@pytest.mark.parametrize("bad", ["sig", "seq", "abort", "tag", "length"])
def test_an_unexpected_frame_is_left_unconsumed(tmp_path, bad):
    in_r, in_w, out_r, out_w = _rings(tmp_path)
    payload = np.array([0.25, 4.0], np.float32).tobytes()
    if bad == "sig":
        _peer_frame(in_w, payload, sig=SIG ^ 1)
    elif bad == "seq":
        _peer_frame(in_w, payload, seq=SEQ + 1)
    elif bad == "abort":
        _peer_frame(in_w, b"no", kind=MsgKind.ABORT)
    elif bad == "tag":
        _peer_frame(in_w, payload, tag=3)
    else:
        _peer_frame(in_w, payload[:4])
    pos0 = in_r._read_pos
    recv = np.zeros(2, np.float32)
    (done, reason, *_), pos = _run(_plan(in_r, out_w, ALLREDUCE),
                                   in_r, np.ones(2, np.float32), recv)
    assert replay.REASONS[reason] == "frame"
    assert done == 0b011                  # the copy and the send; not the receive
    assert pos == pos0 and recv.tolist() == [1.0, 1.0]
    frames: list = []
    in_r.poll(frames)                     # still there for the engine
    assert len(frames) == 1


@needs_replay
def test_no_frame_stops_within_the_bound_and_a_step_limit_stops_early(tmp_path):
    in_r, in_w, out_r, out_w = _rings(tmp_path)
    plan = _plan(in_r, out_w, ALLREDUCE)
    t0 = time.monotonic()
    (done, reason, *_), _ = _run(plan, in_r, np.ones(2, np.float32), np.zeros(2, np.float32),
                                 wait_s=0.01)
    assert replay.REASONS[reason] == "wait" and done == 0b011
    assert time.monotonic() - t0 < 5
    for limit, mask in ((0, 0), (1, 0b001), (2, 0b011)):
        (done, reason, *_), _ = _run(plan, in_r, np.ones(2, np.float32),
                                     np.zeros(2, np.float32), limit=limit)
        assert replay.REASONS[reason] == "limit" and done == mask


# Two RECVs of 8 bytes from rank 1, the second (tag 1) after the first (tag 0).
CHAINED = [(RECV, 0, 0, 1, 0, 8, 0, 0, False, 0, 0b10),
           (RECV, 0, 1, 1, 8, 8, 0, 0, False, 1, 0)]


@needs_replay
def test_a_frame_for_a_recv_not_started_waits_at_the_rings_head(tmp_path):
    # rank 1's two frames come over two rings (two slots, both rank 1's): the second
    # RECV's frame first. It stays where it is until its RECV starts, as the engine would
    # hold it, and the call runs whole.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    in_r, in_w, out_r, out_w = _rings(tmp_path / "a")
    in2_r, in2_w, _, out2_w = _rings(tmp_path / "b")
    plan = native.ring.ReplayPlan(COMM, 0, SIG, -1, -1, [(in_r._nat, out_w._nat, 1),
                                                        (in2_r._nat, out2_w._nat, 1)],
                                  [CHAINED[0], (RECV, 1) + CHAINED[1][2:]])
    _peer_frame(in2_w, np.full(2, 2.0, np.float32).tobytes(), tag=1)

    def later():
        time.sleep(0.05)
        _peer_frame(in_w, np.full(2, 1.0, np.float32).tobytes(), tag=0)
    t = threading.Thread(target=later)
    t.start()
    recv = np.zeros(4, np.float32)
    pos = [in_r._read_pos, in2_r._read_pos]
    done, reason, *_ = plan.run(SEQ, None, recv, None, pos, (5.0, WAIT.c_args), True)
    t.join()
    assert replay.REASONS[reason] == "done" and done == 0b11
    assert recv.tolist() == [1.0, 1.0, 2.0, 2.0]


@needs_replay
def test_a_waiting_frame_with_another_behind_it_is_the_engines(tmp_path):
    # On one ring the second RECV's frame, then the first's: the helper cannot take the
    # one behind without the one ahead, so it stops and leaves both to the engine.
    in_r, in_w, out_r, out_w = _rings(tmp_path)
    _peer_frame(in_w, np.full(2, 2.0, np.float32).tobytes(), tag=1)
    _peer_frame(in_w, np.full(2, 1.0, np.float32).tobytes(), tag=0)
    pos0 = in_r._read_pos
    recv = np.zeros(4, np.float32)
    (done, reason, *_), pos = _run(_plan(in_r, out_w, CHAINED), in_r, None, recv)
    assert replay.REASONS[reason] == "frame" and done == 0 and pos == pos0
    assert recv.tolist() == [0.0] * 4 and len(_frames_of(in_r)) == 2


def _frames_of(ring) -> list:
    got: list = []
    ring.poll(got)
    return got


@needs_replay
def test_a_full_ring_stops_before_the_send(tmp_path):
    in_r, in_w, out_r, out_w = _rings(tmp_path)
    for filler in (bytes(4000), b""):          # big frames, then 16-byte ones
        while out_w.write_now(0, b"", [filler], len(filler)) is not None:
            pass
    (done, reason, *_), _ = _run(_plan(in_r, out_w, ALLREDUCE), in_r,
                                 np.ones(2, np.float32), np.zeros(2, np.float32))
    assert replay.REASONS[reason] == "full" and done == 0b001


@needs_replay
def test_ints_wrap_and_fold_as_numpy_does(tmp_path):
    for dt, op, dtype, ufunc in ((2, 0, np.int32, np.add), (3, 1, np.int64, np.multiply),
                                 (2, 2, np.int32, np.minimum), (3, 3, np.int64, np.maximum),
                                 (1, 1, np.float64, np.multiply)):
        (tmp_path / f"{dt}{op}").mkdir()
        in_r, in_w, out_r, out_w = _rings(tmp_path / f"{dt}{op}")
        n = 4
        isz = np.dtype(dtype).itemsize
        a = np.array([2**31 - 1, -5, 7, 3], dtype) * (3 if isz == 8 else 1)
        b = np.array([1, -9, 2**20, -3], dtype)
        steps = [(COPY, 0, 0, 0, 0, n * isz, 1, 0, False, 0, 0b100),
                 (SEND, 0, 0, 0, 0, n * isz, 0, 0, False, 0, 0),
                 (RECV, 0, 0, 1, 0, n * isz, 0, 0, True, 1, 0)]
        _peer_frame(in_w, b.tobytes())
        recv = np.zeros(n, dtype)
        with np.errstate(over="ignore"):
            want = ufunc(a, b)
        (done, reason, *_), _ = _run(native.ring.ReplayPlan(
            COMM, 0, SIG, dt, op, [(in_r._nat, out_w._nat, 1)], steps), in_r, a, recv)
        assert replay.REASONS[reason] == "done"
        assert recv.tobytes() == want.tobytes(), (dtype, op)


def test_the_dtype_and_op_table_leaves_float_min_max_to_numpy():
    assert "min" not in replay._FLOAT_OPS and "max" not in replay._FLOAT_OPS
    assert "avg" not in replay._INT_OPS and "avg" not in replay._FLOAT_OPS


# -- real ranks -----------------------------------------------------------------------------
def _ranks(nranks, mode, env=None, per_rank=None, timeout=120, victim=None):
    # An early buffer of 8 MiB: calls over 1 MiB keep the engine's 256 KiB eager limit
    # (Engine.eager_limits), so the 1 MiB messages of the "pulled" cases go as pulled DATA
    # at 2 ranks as at 4 (by default only calls over 8 MiB do).
    e = {"POLYCAST_SYMM": "0", "POLYCAST_TRANSPORT": "shm", "POLYCAST_TIMEOUT": "20",
         "POLYCAST_MAX_EARLY_NBYTES": str(8 << 20)}
    e.update(env or {})
    results = spawn_ranks(nranks, [WORKER, mode], env=e, per_rank=per_rank, timeout=timeout)
    return rank_results(results, victim)


def _hashes(res):
    return {k: v for k, v in res.items() if k != "counts"}


@pytest.fixture(scope="module")
def engine_results():
    """The engine path's results without the replay: 4 ranks."""
    return _ranks(4, "calls", env={"POLYCAST_TEST_HOOKS": "replay=0"})


def test_without_the_replay_nothing_is_replayed(engine_results):
    for res in engine_results:
        assert res["counts"]["replayed"] == 0 and res["counts"]["stops"] is None
        assert res["counts"]["off"] == "the replay=0 test hook"
        assert all(len(v) == 1 for v in _hashes(res).values())      # the same every call


@needs_replay
def test_replayed_calls_reach_the_engines_results(engine_results):
    # The counts below are of calls the helper ran whole. A replay whose peer is later than
    # the wait bound (2 ms by default) hands over to the engine, which is right, but on a
    # loaded machine (4 ranks on 2 cores, load 10+) that took 11-14 of the 20 pulled-ring
    # calls. A 50 ms bound keeps this test about the helper; adoption has tests of its own.
    got = _ranks(4, "calls", env={"POLYCAST_TEST_HOOKS": "replay_wait_us=50000"})
    for rank, (res, want) in enumerate(zip(got, engine_results)):
        assert _hashes(res) == _hashes(want), f"rank {rank}"
        c = res["counts"]
        # 19 cases x 20 calls, a few adopted (a peer late by more than the wait bound)
        assert c["replayed"] >= 190, c
        assert c["stops"]["done"] == c["replayed"]
        # the pulled ones too: descriptors written and read by the helper
        pulled = {k: n for k, n in c["by_case"].items() if "pulled" in k}
        assert len(pulled) == 4 and min(pulled.values()) >= 10, pulled
        assert c["pull_out"] == c["cma_sent"] > 0 and c["cma_read"] > 0, c


@needs_replay
def test_a_replay_adopted_at_every_step_reaches_the_same_results(engine_results):
    got = _ranks(4, "calls", env={"REPLAY_REPS": "2", "REPLAY_STEP_LIMITS": "0,1,2,3,4,5,6,7"})
    for rank, (res, want) in enumerate(zip(got, engine_results)):
        assert _hashes(res) == _hashes(want), f"rank {rank}"
        c = res["counts"]
        # limits 1..(steps - 1) stop a replay part-way and the engine adopts the call
        assert c["adopted"] >= 20 and c["stops"]["limit"] >= c["adopted"], c
        # pulled SENDs the helper wrote and the engine finished count once
        assert c["pull_out"] == c["cma_sent"] > 0, c


@needs_replay
def test_a_mixed_job_one_rank_without_the_compiled_helper():
    want = _ranks(2, "calls", env={"POLYCAST_TEST_HOOKS": "replay=0", "REPLAY_REPS": "3"})
    got = _ranks(2, "calls", env={"REPLAY_REPS": "3"},
                 per_rank={1: {"POLYCAST_TEST_HOOKS": "native=0"}})
    assert [_hashes(r) for r in got] == [_hashes(r) for r in want]
    assert got[0]["counts"]["replayed"] > 0
    assert got[1]["counts"]["replayed"] == 0 and "native=0" in got[1]["counts"]["off"]


@needs_replay
def test_a_mismatch_after_replayed_calls_raises_on_every_rank():
    got = _ranks(3, "mismatch")
    for rank, res in enumerate(got):
        assert res["warm_replayed"] > 0, res
        assert res["raised"].startswith("MismatchError"), (rank, res)


@needs_replay
def test_a_mismatch_after_replayed_pulled_calls_raises_on_every_rank():
    got = _ranks(3, "mismatch", env={"REPLAY_WARM": "pulled"})
    for rank, res in enumerate(got):
        assert res["warm_replayed"] > 0, res
        assert res["raised"].startswith("MismatchError"), (rank, res)
        assert res["counts"]["cma_sent"] == res["counts"]["pull_out"] > 0


@needs_replay
def test_a_late_rank_hands_its_held_descriptors_to_the_replay():
    got = _ranks(3, "late")
    for rank, res in enumerate(got):
        assert res["ok"] == 8, (rank, res)
        assert res["counts"]["cma_sent"] == res["counts"]["pull_out"], (rank, res)
    # rank 0 came late: its peers' descriptors were held early, and its calls replayed
    # whole (reading them from the early buffer)
    assert got[0]["pull_held"] >= 8 and got[0]["counts"]["replayed"] >= 4, got[0]
    # the others waited for rank 0 past their bound: adopted with their sends written
    assert sum(r["counts"]["adopted"] for r in got[1:]) >= 4, got


@needs_replay
@pytest.mark.parametrize("warm", ["small", "pulled"])
def test_a_dead_peer_during_replayed_calls_raises_peer_lost(warm):
    got = _ranks(3, "death", env={"POLYCAST_TIMEOUT": "10", "REPLAY_WARM": warm}, victim=2)
    assert len(got) == 2
    for rank, res in enumerate(got):
        assert res["warm_replayed"] > 0, res
        assert res["raised"].startswith("PeerLost") and "rank 2" in res["raised"], (rank, res)
        assert res["seconds"] < 10


@needs_replay
def test_a_stopped_peer_ends_in_the_engines_timeout(tmp_path):
    got = _ranks(3, "timeout", env={"POLYCAST_TIMEOUT": "3", "REPLAY_DONE_DIR": str(tmp_path)})
    for res in got[:2]:
        assert res["warm_replayed"] > 0, res
        assert res["raised"].startswith("CollectiveTimeout"), res


@needs_replay
def test_a_frame_the_engine_held_early_is_delivered_when_its_step_starts(tmp_path):
    in_r, in_w, out_r, out_w = _rings(tmp_path)
    send, recv = np.ones(2, np.float32), np.zeros(2, np.float32)
    early = np.array([3.0, 5.0], np.float32).tobytes()
    pos = [in_r._read_pos]
    done, reason, _, _, nsent, _, nrecv, _, *_ = _plan(in_r, out_w, ALLREDUCE).run(
        SEQ, send, recv, None, pos, (0.05, WAIT.c_args), True, -1, [(2, early)])
    assert replay.REASONS[reason] == "done" and done == 0b111
    assert (nsent, nrecv) == (1, 0) and recv.tolist() == [4.0, 6.0]
    with pytest.raises(ValueError):     # a held frame must be a RECV's, of its length
        _plan(in_r, out_w, ALLREDUCE).run(SEQ, send, recv, None, pos, (0.05, WAIT.c_args),
                                          True, -1, [(1, early)])


def test_the_engine_hands_over_what_it_held_early_for_the_next_call_only():
    from polycast.algorithms import build
    from polycast.engine.engine import Engine
    sched = build("allreduce", "recdoubling", 2, 2)
    eng = Engine(0, 2)
    prog = eng.replay_program(sched, 4, "float32", "sum", 1 << 20)
    assert prog is not None and prog.nsend == prog.nrecv == 1
    assert eng.replay_begin(sched, prog) == []              # idle, nothing held
    h = make_header(MsgKind.DATA, 0, 0, 1, 0, 0, 8, prog.sig)
    eng.on_message(1, h, memoryview(bytes(8)), 0.0)        # before the call: held early
    held = eng.replay_begin(sched, prog)
    assert [(src, hh) for _, src, hh, _ in held] == [(1, h)]
    assert prog.steps[held[0][0]].kind.name == "RECV"
    assert eng.stats.early_nbytes == 0
    eng.replay_give_back(held)                              # not used: held again
    assert eng.stats.early_nbytes > 0
    bad = make_header(MsgKind.DATA, 0, 0, 1, 0, 0, 8, prog.sig ^ 1)
    eng2 = Engine(0, 2)
    eng2.on_message(1, bad, memoryview(bytes(8)), 0.0)      # another call's: engine's path
    assert eng2.replay_begin(sched, prog) is None


def _sleeping_setup(tmp_path):
    """Rings and the allreduce plan for the futex-sleep tests (skipped without futexes)."""
    from polycast.runtime.transport import futex
    if not futex.available():
        pytest.skip(f"no futexes: {futex.unavailable_reason()}")
    in_r, in_w, out_r, out_w = _rings(tmp_path)
    return in_r, in_w, _plan(in_r, out_w, ALLREDUCE)


@needs_replay
def test_a_waiting_replay_sleeps_on_the_ring_and_the_peers_frame_wakes_it(tmp_path):
    from polycast.runtime.transport import futex
    in_r, in_w, plan = _sleeping_setup(tmp_path)
    bells = []

    def peer():
        end = time.monotonic() + 10
        while in_r._get(16) != SLEEP_FUTEX and time.monotonic() < end:
            time.sleep(0.001)                   # until the replay sleeps on the ring
        h = make_header(MsgKind.DATA, COMM, SEQ, 1, 0, 0, 8, SIG).pack()
        bell = in_w.write_now(len(h), h, [np.ones(2, np.float32).tobytes()], 8)
        bells.append(bell)
        if bell == SLEEP_FUTEX:                  # what the peer's driver does
            futex.wake(in_w.data_bell_addr, 1 << 30)
    t = threading.Thread(target=peer)
    t.start()
    t0 = time.monotonic()
    pos = [in_r._read_pos]
    done, reason, *_ = plan.run(SEQ, np.ones(2, np.float32), np.zeros(2, np.float32), None,
                                pos, (20.0, WAIT.c_args), True)
    took = time.monotonic() - t0
    t.join()
    assert replay.REASONS[reason] == "done" and done == 0b111
    assert bells == [SLEEP_FUTEX]               # it slept, flagged as a futex sleeper
    assert plan.counts()[4] >= 1 and took < 10  # and the frame's wake-up ended the sleep
    assert in_r._get(16) == 0                   # its sleeping flag is cleared again


@needs_replay
def test_a_sleeping_flag_another_sleeper_clears_costs_a_slice_not_the_wait(tmp_path):
    # The progress thread sleeps on the same rings and sets and clears their sleeping flag
    # as it likes (driver/progress.py). Cleared while the replay sleeps, the peer's frame
    # wakes nobody: the replay must look again within its sleep slice (~1 ms), not sleep
    # out its whole wait bound (20 s here).
    in_r, in_w, plan = _sleeping_setup(tmp_path)
    in_r.set_sleeping(SLEEP_FUTEX)              # the other sleeper's flag, set first

    def peer():
        time.sleep(0.05)                        # the replay is asleep by now
        in_r.set_sleeping(0)                    # the other sleeper woke and cleared it
        h = make_header(MsgKind.DATA, COMM, SEQ, 1, 0, 0, 8, SIG).pack()
        # written, and no wake-up sent (whatever the flag says by now)
        assert in_w.write_now(len(h), h, [np.ones(2, np.float32).tobytes()], 8) is not None
    t = threading.Thread(target=peer)
    t.start()
    t0 = time.monotonic()
    pos = [in_r._read_pos]
    done, reason, *_ = plan.run(SEQ, np.ones(2, np.float32), np.zeros(2, np.float32), None,
                                pos, (20.0, WAIT.passive().c_args), True)
    took = time.monotonic() - t0
    t.join()
    assert replay.REASONS[reason] == "done" and done == 0b111
    assert took < 5, took                       # no wake-up came: the slice ended the sleep
