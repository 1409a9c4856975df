"""Pulled DATA in the compiled replay (runtime/driver/_replay.c): a large message between ranks
that read each other single-copy goes as the driver's descriptor frame, byte for byte
(driver/peers.py), is read with process_vm_readv and acknowledged by seq; anything else is
left unconsumed for the engine. Real ranks: tests/test_replay.py (the "pulled" cases)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from polycast.engine.wire import F_PULL, MsgKind, make_header
from polycast.runtime.transport import cma, native
from polycast.runtime.driver import replay
from polycast.runtime.transport.frames import KIND_CMA, KIND_CMA_DONE
from polycast.runtime.transport.wait import WaitPolicy

# our rings with rank 1 (this very process, as far as reads go)
from test_replay import _rings

pytestmark = [
    pytest.mark.skipif(replay.unavailable_reason() is not None,
                       reason=f"no compiled replay: {replay.unavailable_reason()}"),
    pytest.mark.skipif(cma.disabled_reason() is not None or cma.probe(
        os.getpid(), cma.probe_info()) is not None,
        reason="process_vm_readv cannot read this process here"),
]
COMM, SIG, SEQ = 5, 0xA1B2C3D4, 77
SEND, RECV = 0, 1
NBYTES = 1 << 20
WAITS = (0.05, WaitPolicy().c_args)


def _plan(in_r, out_w, kind):
    # one step: a pulled SEND of send[0:NBYTES] to rank 1, or a pulled RECV into recv
    step = (kind, 0, 0, kind, 0, NBYTES, 0, 0, False, 0, 0, True)
    return native.ring.ReplayPlan(COMM, 0, SIG, -1, -1,
                                  [(in_r._nat, out_w._nat, 1, os.getpid())], [step])


def _run(plan, in_r, send, recv, cseq=4, held=None, wait_s=0.05):
    pos, cseqs = [in_r._read_pos], [cseq]
    out = plan.run(SEQ, send, recv, None, pos, (wait_s, WAITS[1]), True, -1, held, False,
                   cseqs)
    in_r._read_pos = pos[0]
    return out, cseqs[0]


def _frames(ring) -> list:
    got: list = []
    ring.poll(got)
    return [(hdr_len, bytes(header), bytes(payload)) for hdr_len, header, payload, _ in got]


def _descriptor(seq: int, addr: int, nbytes: int, *, sig=SIG, flags=F_PULL) -> bytes:
    h = make_header(MsgKind.DATA, COMM, SEQ, 1, 0, 0, nbytes, sig, 0, flags).pack()
    return cma.DESC.pack(seq, addr, nbytes) + h


def _ack(ring, *seqs: int) -> None:
    body = b"".join(cma.ACK.pack(s) for s in seqs)
    assert ring.write_now(KIND_CMA_DONE, b"", [body], len(body)) is not None


def test_a_pulled_send_is_the_drivers_descriptor_and_ends_on_its_acknowledgement(tmp_path):
    in_r, in_w, out_r, out_w = _rings(tmp_path)
    send = np.arange(NBYTES, dtype=np.uint8)
    seen = {}

    def peer():                 # rank 1: reads the descriptor's bytes, acknowledges them
        end = time.monotonic() + 10
        while time.monotonic() < end:
            frames = _frames(out_r)
            if frames:
                seen["frames"] = frames
                seq, addr, nbytes = cma.DESC.unpack_from(frames[0][2])
                got = np.empty(nbytes, np.uint8)
                cma.read(os.getpid(), [(got.ctypes.data, nbytes)], [(addr, nbytes)])
                seen["bytes_ok"] = bool((got == send).all())
                _ack(in_w, seq)
                return
            time.sleep(0.001)
    t = threading.Thread(target=peer)
    t.start()
    (done, reason, _, _, nsent, sent_nb, nrecv, _, written, owed, nread), cseq = _run(
        _plan(in_r, out_w, SEND), in_r, send, None, wait_s=10)
    t.join()
    assert replay.REASONS[reason] == "done" and done == 1
    assert written is None and owed is None and (nsent, sent_nb, nrecv, nread) == (1, NBYTES,
                                                                                   0, 0)
    assert cseq == 5                            # the peer's next single-copy number
    want = _descriptor(5, cma.address_of(send), NBYTES)
    want = want[:cma.DESC.size] + make_header(MsgKind.DATA, COMM, SEQ, 0, 0, 0, NBYTES, SIG,
                                              0, F_PULL).pack()
    assert seen["frames"] == [(KIND_CMA, b"", want)] and seen["bytes_ok"]
    assert not in_r.pending_input()             # the acknowledgement was taken


def test_an_unacknowledged_send_stops_as_written_and_a_stranger_ack_stays(tmp_path):
    in_r, in_w, out_r, out_w = _rings(tmp_path)
    send = np.ones(NBYTES, np.uint8)
    plan = _plan(in_r, out_w, SEND)
    (done, reason, *_, written, owed, _), cseq = _run(plan, in_r, send, None, wait_s=0.01)
    assert replay.REASONS[reason] == "wait" and done == 0
    assert written == [(0, 5)] and owed is None and cseq == 5
    _ack(in_w, 99)                              # not ours: the engine's to look at
    pos0 = in_r._read_pos
    (done, reason, *_, written, _, _), cseq = _run(plan, in_r, send, None, cseq=5)
    assert replay.REASONS[reason] == "frame" and done == 0 and written == [(0, 6)]
    assert in_r._read_pos == pos0 and len(_frames(in_r)) == 1


def test_a_pulled_recv_reads_the_peers_memory_and_acknowledges_it(tmp_path):
    in_r, in_w, out_r, out_w = _rings(tmp_path)
    src = (np.arange(NBYTES) % 251).astype(np.uint8)
    d = _descriptor(7, cma.address_of(src), NBYTES)
    assert in_w.write_now(KIND_CMA, b"", [d], len(d)) is not None
    recv = np.zeros(NBYTES, np.uint8)
    (done, reason, _, _, nsent, _, nrecv, recv_nb, written, owed, nread), cseq = _run(
        _plan(in_r, out_w, RECV), in_r, None, recv)
    assert replay.REASONS[reason] == "done" and done == 1 and (recv == src).all()
    assert (nsent, nrecv, recv_nb, nread, written, owed) == (0, 1, NBYTES, 1, None, None)
    assert cseq == 4 and not in_r.pending_input()
    assert _frames(out_r) == [(KIND_CMA_DONE, b"", cma.ACK.pack(7))]


def test_a_plan_that_only_receives_needs_no_seqs(tmp_path):
    # a broadcast's leaf: pulled RECVs only (no descriptors of its own to number)
    in_r, in_w, out_r, out_w = _rings(tmp_path)
    src = np.full(NBYTES, 5, np.uint8)
    d = _descriptor(3, cma.address_of(src), NBYTES)
    assert in_w.write_now(KIND_CMA, b"", [d], len(d)) is not None
    recv = np.zeros(NBYTES, np.uint8)
    pos = [in_r._read_pos]
    done, reason, *_ = _plan(in_r, out_w, RECV).run(SEQ, None, recv, None, pos, WAITS, True)
    assert replay.REASONS[reason] == "done" and done == 1 and (recv == 5).all()


def test_a_held_pulled_data_is_read_when_its_step_starts(tmp_path):
    in_r, in_w, out_r, out_w = _rings(tmp_path)
    src = np.full(NBYTES, 3, np.uint8)
    recv = np.zeros(NBYTES, np.uint8)
    (done, reason, *_, written, owed, nread), _ = _run(
        _plan(in_r, out_w, RECV), in_r, None, recv,
        held=[(0, (cma.address_of(src), NBYTES, 11))])
    assert replay.REASONS[reason] == "done" and done == 1 and (recv == 3).all()
    assert nread == 1 and owed is None
    assert _frames(out_r) == [(KIND_CMA_DONE, b"", cma.ACK.pack(11))]
    with pytest.raises(ValueError):             # a held descriptor must fit its step
        _run(_plan(in_r, out_w, RECV), in_r, None, recv,
             held=[(0, (cma.address_of(src), NBYTES - 1, 11))])


def test_an_acknowledgement_a_full_ring_cannot_take_is_owed_to_python(tmp_path):
    in_r, in_w, out_r, out_w = _rings(tmp_path)
    for filler in (bytes(4000), b""):
        while out_w.write_now(0, b"", [filler], len(filler)) is not None:
            pass
    src = np.full(NBYTES, 9, np.uint8)
    d = _descriptor(8, cma.address_of(src), NBYTES)
    assert in_w.write_now(KIND_CMA, b"", [d], len(d)) is not None
    recv = np.zeros(NBYTES, np.uint8)
    (done, reason, *_, owed, nread), _ = _run(_plan(in_r, out_w, RECV), in_r, None, recv)
    assert replay.REASONS[reason] == "done" and (recv == 9).all()
    assert owed == [(0, 8)] and nread == 1


@pytest.mark.parametrize("bad", ["unreadable", "eager", "sig", "unflagged", "length"])
def test_a_descriptor_it_cannot_take_is_left_unconsumed(tmp_path, bad):
    in_r, in_w, out_r, out_w = _rings(tmp_path)
    src = np.ones(NBYTES, np.uint8)
    if bad == "eager":          # the payload in the ring, where a descriptor is due
        h = make_header(MsgKind.DATA, COMM, SEQ, 1, 0, 0, 8, SIG).pack()
        assert in_w.write_now(len(h), h, [bytes(8)], 8) is not None
    else:
        d = {"unreadable": lambda: _descriptor(7, 4096, NBYTES),     # unmapped
             "sig": lambda: _descriptor(7, cma.address_of(src), NBYTES, sig=SIG ^ 1),
             "unflagged": lambda: _descriptor(7, cma.address_of(src), NBYTES, flags=0),
             "length": lambda: _descriptor(7, cma.address_of(src), NBYTES // 2)}[bad]()
        assert in_w.write_now(KIND_CMA, b"", [d], len(d)) is not None
    pos0 = in_r._read_pos
    recv = np.zeros(NBYTES, np.uint8)
    (done, reason, *_, nread), _ = _run(_plan(in_r, out_w, RECV), in_r, None, recv)
    assert replay.REASONS[reason] == "frame" and done == 0 and nread == 0
    assert in_r._read_pos == pos0 and len(_frames(in_r)) == 1     # the engine's now
    assert _frames(out_r) == []                                    # nothing acknowledged


def test_a_plan_refuses_pulled_steps_it_cannot_run(tmp_path):
    in_r, in_w, out_r, out_w = _rings(tmp_path)
    reduce_step = (RECV, 0, 0, 1, 0, NBYTES, 0, 0, True, 0, 0, True)
    with pytest.raises(ValueError):             # reads in place only: no reduction
        native.ring.ReplayPlan(COMM, 0, SIG, 0, 0, [(in_r._nat, out_w._nat, 1, os.getpid())],
                               [reduce_step])
    with pytest.raises(ValueError):             # no process to read
        native.ring.ReplayPlan(COMM, 0, SIG, -1, -1, [(in_r._nat, out_w._nat, 1)],
                               [(RECV, 0, 0, 1, 0, NBYTES, 0, 0, False, 0, 0, True)])
    with pytest.raises(ValueError):             # the seqs are needed
        _plan(in_r, out_w, SEND).run(SEQ, np.ones(NBYTES, np.uint8), None, None,
                                     [in_r._read_pos], WAITS, True)
