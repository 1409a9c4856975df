"""MPI request semantics through Comm, on one rank in this process (messages to self):
null requests (REQUEST_NULL), the multiple-completion calls skipping finished requests
(Waitany/Testany/Waitsome/Testsome end with UNDEFINED / None instead of returning a
finished request again), statuses lists, Cancel of an unmatched receive, persistent
requests in those calls, and the object receive's ``buf`` warning and empty message."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

import polycast
from polycast import REQUEST_NULL, UNDEFINED, Prequest, Request, Status


@pytest.fixture(scope="module")
def comm():
    from polycast.tools.launch import free_port
    c = polycast.init(rank=0, size=1, master_addr="127.0.0.1", master_port=free_port(),
                      timeout=10)
    yield c
    polycast.finalize()


def test_the_null_request():
    r = Request()
    assert not r and r == REQUEST_NULL and not (r != REQUEST_NULL)
    st = Status()
    st._fill(3, 4, 5)
    assert r.Wait(st) is True and r.wait() is None and r.Test() and (st.source, st.tag, st.count) == (
        polycast.ANY_SOURCE, polycast.ANY_TAG, 0)
    with pytest.raises(TypeError):
        hash(r)                                 # an MPI handle, as mpi4py's
    with pytest.raises(TypeError, match="not MPI handles"):
        Request(Request())
    assert Request.Waitany([r, None]) == UNDEFINED
    assert Request.Testany([r]) == (UNDEFINED, True)
    assert Request.Waitsome([r]) is None and Request.Testsome([r]) is None
    assert Request.Testall([r]) and Request.Waitall([r]) is True
    assert Request.waitall([r, r]) == [None, None]


def test_waitany_and_testany_skip_finished_requests(comm):
    reqs = [comm.isend(("m", i), 0, tag=1) for i in range(3)]     # to self: buffered
    assert all(reqs)
    assert [Request.Waitany(reqs) for _ in range(3)] == [0, 1, 2]
    assert not any(reqs) and all(r == REQUEST_NULL for r in reqs)
    assert Request.Waitany(reqs) == UNDEFINED and Request.Testany(reqs) == (UNDEFINED, True)
    rreqs = [comm.irecv(source=0, tag=1) for _ in range(3)]
    got = [Request.waitany(rreqs) for _ in range(3)]
    assert sorted(i for i, _ in got) == [0, 1, 2] and all(o == ("m", i) for i, o in got)
    assert Request.waitany(rreqs) == (UNDEFINED, None)
    assert Request.testany(rreqs) == (UNDEFINED, True, None)


@pytest.mark.parametrize("sends", [False, True])
def test_waitsome_testsome_return_each_request_once(comm, sends):
    """The former hang: Testsome returned the finished request 5 again, so mpi4py's
    ``while idxs != expected: idxs += testsome(...)`` never ended until the unmatched
    Ssend of tag 0 timed out."""
    c = comm.Dup()
    if sends:
        reqs = [c.issend("abc", 0, tag=i) for i in range(6)]
    else:
        reqs = [c.irecv(source=0, tag=i) for i in range(6)]
    sts: list = []
    assert Request.Testsome(reqs, sts) == [] and sts == [] and all(reqs)
    for batch in ([5], [], [3, 1, 2], [0, 4]):
        for i in batch:
            if sends:
                assert c.recv(source=0, tag=i) == "abc"
            else:
                c.ssend("abc", 0, tag=i)
        sts = []
        idxs, objs = (Request.waitsome if batch else Request.testsome)(reqs, sts)
        assert sorted(idxs) == sorted(batch) and objs == [None if sends else "abc"] * len(batch)
        assert len(sts) == len(batch) and not any(reqs[i] for i in idxs)
        if not sends:
            assert sorted(s.tag for s in sts) == sorted(batch) and all(s.source == 0 for s in sts)
    assert Request.waitsome(reqs) == (None, None) and Request.testsome(reqs) == (None, None)
    c.Free()


def test_cancel_of_an_unmatched_receive(comm):
    y = np.zeros(3)
    r = comm.Irecv(y, 0, 7)
    r.Cancel()
    st = Status()
    assert r.Get_status(st) and st.Is_cancelled()
    assert r.Wait(st) and st.Is_cancelled() and not r
    comm.Send(np.arange(3.0), 0, 7)            # goes to the next receive, not the cancelled
    z = np.zeros(3)
    comm.Recv(z, 0, 7, st)
    assert z.tolist() == [0, 1, 2] and y.tolist() == [0, 0, 0] and not st.Is_cancelled()
    o = comm.irecv(source=0, tag=8)
    o.cancel()
    assert o.wait() is None
    # a send is not cancelled (MPI-4.1 deprecates it): it completes once received
    s = comm.issend({"k": 1}, 0, tag=9)
    s.Cancel()
    assert not s.Test()
    assert comm.recv(source=0, tag=9) == {"k": 1}
    s.Wait(st)
    assert not st.Is_cancelled()
    # a matched receive is not cancelled either
    comm.send("x", 0, tag=10)
    m = comm.irecv(source=0, tag=10)
    m.Wait()
    m.Cancel()
    assert m.result == "x"


def test_recv_buf_warns_and_empty_message_is_none(comm):
    comm.isend("42", 0).Wait()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="buf"):
            comm.recv(bytearray(8), polycast.PROC_NULL)
    with pytest.warns(UserWarning):
        assert comm.recv(bytearray(128), 0) == "42"
    comm.Isend(None, 0).Wait()                  # an empty buffer message
    assert comm.recv(source=0) is None
    comm.Isend(np.frombuffer(pickle.dumps([1, "a"]), np.uint8), 0).Wait()
    assert comm.recv(source=0) == [1, "a"]      # a buffer holding a pickle: the object


def test_waitall_extends_statuses_and_persistent_requests(comm):
    out, got = np.arange(4.0), np.zeros(4)
    sts: list = []
    Request.Waitall([comm.Irecv(got, 0, 3), comm.Isend(out, 0, 3)], sts)
    assert len(sts) == 2 and sts[0].tag == 3 and sts[0].Get_count(np.float64) == 4
    ps, pr = comm.Send_init(out, 0, 4), comm.Recv_init(got, 0, 4)
    for _ in range(2):
        Prequest.Startall([ps, pr])
        first = Prequest.Waitany([ps, pr])
        second = Prequest.Waitany([ps, pr])
        assert {first, second} == {0, 1} and Prequest.Waitany([ps, pr]) == UNDEFINED
        assert ps and ps != REQUEST_NULL        # inactive, not null
    ps.Free()
    pr.Free()
    assert not ps and ps == REQUEST_NULL and pr == REQUEST_NULL
    assert Prequest() == REQUEST_NULL and not Prequest()
    with pytest.raises(polycast.InvalidArgument, match="freed"):
        Prequest().Start()
    with pytest.raises(TypeError, match="not MPI handles"):
        Prequest(comm.Send_init(out, 0, 4))


def test_status_copy_and_setters_and_nondestructive_get_status(comm):
    st = Status()
    st.source, st.tag, st.error = 1, 2, 12
    st.Set_elements(np.float64, 3)
    st.Set_cancelled(True)
    cp = Status(st)
    assert (cp.source, cp.tag, cp.error, cp.Get_count(np.float64), cp.Is_cancelled()) == (
        1, 2, 12, 3, True)
    cp.count = 7
    assert cp.Get_count() == 7 and st.count == 24
    with pytest.raises(TypeError):
        Status(123)
    reqs = [comm.isend(i, 0, tag=20 + i) for i in range(2)] + [Request()]
    sts: list = []
    assert Request.Get_status_all(reqs, sts) and len(sts) == 3
    assert Request.Get_status_any(reqs) == (0, True) and Request.Get_status_some(reqs) == [0, 1]
    assert all(reqs[:2])                        # not finished by the Get_status calls
    assert Request.Waitall(reqs) is True and not any(reqs)
    assert [comm.recv(source=0, tag=20 + i) for i in range(2)] == [0, 1]
    assert Request.Get_status_any(reqs) == (UNDEFINED, True)
    assert Request.Get_status_some(reqs) is None


def test_matched_probe_takes_the_message_out_of_matching(comm):
    from polycast.comm.message import MESSAGE_NO_PROC, MESSAGE_NULL, Message
    c = comm.Dup()
    assert c.Improbe() is None
    s = c.Isend(np.arange(4.0), 0, 5)
    st = Status()
    m = c.Mprobe(0, 5, st)
    assert m and isinstance(m, Message) and st.Get_count(np.float64) == 4 and st.tag == 5
    assert c.Improbe(0, 5) is None and not c.Iprobe(0, 5)     # taken: no receive sees it
    other = c.Irecv(np.zeros(4), 0, 5)                        # ... nor takes it
    c.Send(np.full(4, 9.0), 0, 5)                             # this one goes to `other`
    got = np.zeros(4)
    m.Recv(got, st)
    assert got.tolist() == [0, 1, 2, 3] and not m and m == MESSAGE_NULL
    other.Wait()
    s.Wait()
    with pytest.raises(polycast.InvalidArgument, match="MESSAGE_NULL"):
        m.Recv(got)
    c.send({"o": 1}, 0, tag=6)
    assert c.mprobe(0, 6).recv() == {"o": 1}
    c.isend([2], 0, tag=7).Wait()
    assert Message.iprobe(c, 0, 7).irecv().wait() == [2]
    # PROC_NULL: MESSAGE_NO_PROC, received at once, empty; copies; pickling
    assert c.Mprobe(polycast.PROC_NULL) == MESSAGE_NO_PROC and MESSAGE_NO_PROC
    cp = Message(MESSAGE_NO_PROC)
    cp.Recv(None, st)
    assert cp == MESSAGE_NULL and MESSAGE_NO_PROC and st.source == polycast.PROC_NULL
    assert pickle.loads(pickle.dumps(MESSAGE_NULL)) is MESSAGE_NULL
    c.Isend(np.zeros(1), 0, 8).Wait()
    taken = c.Mprobe(0, 8)
    with pytest.raises(ValueError):
        pickle.dumps(taken)
    with pytest.raises(ValueError):
        pickle.dumps(c.Irecv(np.zeros(1), 0, 99))
    taken.Recv(np.zeros(1))
    c.Free()
