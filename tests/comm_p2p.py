"""A rank program for tests/test_comm_p2p.py: point-to-point through Comm (buffers and
objects, eager and rendezvous, ANY_SOURCE, to self, Probe, PROC_NULL, non-overtaking,
truncation, send modes, Cancel, Mprobe, then a collective to show the communicator is in step).
Prints "P2P OK r"."""
import time

import numpy as np

import polycast

comm = polycast.init()
r, P = comm.rank, comm.size
nxt, prv = (r + 1) % P, (r - 1) % P
for n in (4, 100000, 400000):      # eager; 400 KB eager over shm only; 1.6 MB rendezvous
    x = np.arange(n, dtype=np.float32) + r
    y = np.zeros(n, np.float32)
    st = polycast.Status()
    comm.Sendrecv(x, nxt, 3, y, prv, 3, st)
    assert (y == np.arange(n) + prv).all(), (n, y[:4])
    assert st.Get_source() == prv and st.Get_tag() == 3 and st.Get_count(np.float32) == n
# any source
if r == 0:
    got = sorted(comm.recv(source=polycast.ANY_SOURCE, tag=5) for _ in range(P - 1))
    assert got == [("hi", i) for i in range(1, P)], got
else:
    comm.send(("hi", r), 0, tag=5)
# self
comm.Send(np.array([7, 8]), r, 9)
z = np.zeros(2, int)
comm.Recv(z, r, 9)
assert z.tolist() == [7, 8]
# probe
if r == 1:
    comm.send({"big": list(range(1000))}, 0, 11)
if r == 0:
    st = polycast.Status(); comm.Probe(1, 11, st); assert st.Get_source() == 1 and st.Get_tag() == 11 and st.Get_count() > 1000, st
    assert comm.recv(source=1, tag=11)["big"][-1] == 999
# proc null
comm.Send(np.zeros(1), polycast.PROC_NULL)
comm.Recv(np.zeros(1), polycast.PROC_NULL)
# non-overtaking
if r == 0:
    for i in range(20): comm.Send(np.array([i]), 1, 0)
elif r == 1:
    seq = []
    for i in range(20):
        b = np.zeros(1, int)
        comm.Recv(b, 0, 0)
        seq.append(int(b[0]))
    assert seq == list(range(20)), seq
# truncation (2 MB: over the eager limit of every transport, so by rendezvous)
if r == 0:
    try:
        comm.Send(np.zeros(250000), 1, 1)
        raise AssertionError("a truncated rendezvous send succeeded")
    except polycast.InvalidArgument as e:
        assert "truncation" in str(e), e
elif r == 1:
    try:
        comm.Recv(np.zeros(10), 0, 1)
        raise AssertionError("a truncated receive succeeded")
    except polycast.InvalidArgument as e:
        assert "truncation" in str(e), e
# send modes: a small Ssend completes only once matched (a small Send would not wait);
# rank 1 cannot take tag 11 before tag 12, which rank 0 sends after checking.
if r == 0:
    sreq = comm.Issend(np.arange(3.0), 1, 11)
    time.sleep(0.3)
    assert not sreq.Test(), "an unmatched Ssend completed"
    comm.Bsend(np.arange(3.0), 1, 12)
    sreq.Wait()
    comm.ssend({"s": 1}, 1, 13)
elif r == 1:
    got = np.zeros(3)
    comm.Recv(got, 0, 12)
    comm.Recv(got, 0, 11)
    assert (got == np.arange(3.0)).all()
    assert comm.recv(source=0, tag=13) == {"s": 1}
# Isendrecv(_replace) around the ring, persistent Send_init / Recv_init, PROC_NULL with None
y = np.zeros(5)
st = polycast.Status()
comm.Isendrecv(np.full(5, float(r)), nxt, 21, y, prv, 21).Wait(st)
assert (y == prv).all() and st.Get_source() == prv, (y, st)
z = np.full(5, float(r))
comm.Isendrecv_replace(z, nxt, 22, prv, 22).Wait()
assert (z == prv).all(), z
out, got = np.zeros(2), np.zeros(2)
ps, pr = comm.Send_init(out, nxt, 23), comm.Recv_init(got, prv, 23)
for step in range(3):
    out[:] = (r, step)
    polycast.Prequest.Startall([pr, ps])
    polycast.Request.Waitall([ps, pr])
    assert got.tolist() == [prv, step], got
comm.Send(None, polycast.PROC_NULL)
comm.Recv(None, polycast.PROC_NULL)
# Cancel: rank 1's receive from rank 0, unmatched, is taken back; what rank 0 sends after
# the barrier goes to the next receive
if r == 1:
    c = comm.Irecv(np.zeros(2), 0, 31)
    c.Cancel()
    st = polycast.Status()
    c.Wait(st)
    assert st.Is_cancelled() and not c and c == polycast.REQUEST_NULL
comm.Barrier()
if r == 0:
    comm.Send(np.array([5.0, 6.0]), 1, 31)
elif r == 1:
    g = np.zeros(2)
    comm.Recv(g, 0, 31, st)
    assert g.tolist() == [5, 6] and not st.Is_cancelled(), (g, st)
# matched probe: rank 0 takes rank 1's large (rendezvous) message by Mprobe, sized by it
if r == 1:
    comm.Send(np.arange(400000, dtype=np.int32), 0, 41)     # 1.6 MB: over the eager limits
elif r == 0:
    st = polycast.Status()
    m = comm.Mprobe(polycast.ANY_SOURCE, 41, st)
    assert comm.Improbe(1, 41) is None and st.Get_source() == 1
    big = np.empty(st.Get_count(np.int32), np.int32)
    m.Recv(big)
    assert (big == np.arange(400000)).all() and not m
comm.Barrier()
print("P2P OK", r, flush=True)
polycast.finalize()
