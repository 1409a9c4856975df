"""A rank program for tests/test_comm_vector.py: the vector and scan collectives against a
numpy reference (uneven, zero and equal counts, displacements, IN_PLACE, I-forms), then
bad counts that must fail on every rank and leave the communicator in step. Prints
"VECTOR OK r"."""
import numpy as np

import polycast
from polycast.errors import InvalidArgument, MismatchError

comm = polycast.init()
r, P = comm.rank, comm.size


def data(rank, n, dtype=np.float64):
    return (np.arange(n) + 100 * rank).astype(dtype)


def displs_of(counts, gap=0):
    out, pos = [], 0
    for c in counts:
        out.append(pos)
        pos += c + gap
    return out


def expect_refusal(fn, what):
    try:
        fn()
    except InvalidArgument as exc:
        return str(exc)
    raise AssertionError(f"rank {r}: {what} did not raise")


cases = [[(i % 3) + 1 for i in range(P)],          # uneven
         [0] * P,                                   # nothing at all
         [0 if i == 1 else 5 for i in range(P)],   # one rank empty
         [4] * P]                                   # equal: the direct path

for counts in cases:
    for gap in (0, 2):
        ds = displs_of(counts, gap)
        total = ds[-1] + counts[-1] + gap
        # Allgatherv
        out = np.full(total, -1.0)
        comm.Allgatherv(data(r, counts[r]), [out, counts, ds])
        for i in range(P):
            assert (out[ds[i]:ds[i] + counts[i]] == data(i, counts[i])).all(), (counts, out)
        # the I-form, in place
        out = np.full(total, -1.0)
        out[ds[r]:ds[r] + counts[r]] = data(r, counts[r])
        comm.Iallgatherv(polycast.IN_PLACE, [out, counts, ds]).Wait()
        for i in range(P):
            assert (out[ds[i]:ds[i] + counts[i]] == data(i, counts[i])).all(), (counts, out)
        # Gatherv / Scatterv at every root
        for root in range(P):
            out = np.full(total, -1.0) if r == root else None
            comm.Gatherv(data(r, counts[r]), [out, counts, ds] if r == root else None, root)
            if r == root:
                for i in range(P):
                    assert (out[ds[i]:ds[i] + counts[i]] == data(i, counts[i])).all()
            src = np.arange(total, dtype=np.float64) * (root + 1) if r == root else None
            got = np.full(counts[r], -1.0)
            comm.Iscatterv([src, counts, ds] if r == root else None, got, root).Wait()
            want = np.arange(ds[r], ds[r] + counts[r], dtype=np.float64) * (root + 1)
            assert (got == want).all(), (root, counts, got, want)
    # Reduce_scatter with counts, each op kind
    n = sum(counts)
    x = np.arange(n, dtype=np.int64) * (r + 1)
    y = np.full(counts[r], -1, np.int64)
    comm.Reduce_scatter(x, y, counts, op="sum")
    off = sum(counts[:r])
    assert (y == np.arange(off, off + counts[r]) * sum(range(1, P + 1))).all(), (counts, y)
    y = np.full(counts[r], -1, np.int64)
    comm.Ireduce_scatter(x, y, None, op="max").Wait()       # counts from recvbuf sizes
    assert (y == np.arange(off, off + counts[r]) * P).all(), (counts, y)
    z = x.copy()
    comm.Reduce_scatter(polycast.IN_PLACE, z, counts, op="sum")
    assert (z[:counts[r]] == np.arange(off, off + counts[r]) * sum(range(1, P + 1))).all()

# Alltoallv: rank j sends (j + i) % 3 elements to rank i
sc = [(r + i) % 3 for i in range(P)]
rc = [(j + r) % 3 for j in range(P)]
sd, rd = displs_of(sc, 1), displs_of(rc, 1)
send = np.zeros(sd[-1] + sc[-1] + 1, np.int32)
for i in range(P):
    send[sd[i]:sd[i] + sc[i]] = 1000 * r + 10 * i + np.arange(sc[i])
recv = np.full(rd[-1] + rc[-1] + 1, -1, np.int32)
comm.Alltoallv([send, sc, sd], [recv, rc, rd])
for j in range(P):
    assert (recv[rd[j]:rd[j] + rc[j]] == 1000 * j + 10 * r + np.arange(rc[j])).all(), recv
recv = np.full(4 * P, -1, np.int32)                          # equal counts, I-form
comm.Ialltoallv([np.repeat(np.arange(P, dtype=np.int32) + 10 * r, 4), 4], [recv, 4]).Wait()
assert (recv == np.repeat(np.arange(P, dtype=np.int32) * 10 + r, 4)).all(), recv

# Scan / Exscan with sum, a non-commutative user op, and MAXLOC
x = data(r, 3)
y = np.empty(3)
comm.Scan(x, y, op="sum")
assert np.allclose(y, sum(data(i, 3) for i in range(r + 1))), y
y = np.full(3, -7.0)
comm.Iexscan(x, y, op="sum").Wait()
assert np.allclose(y, sum(data(i, 3) for i in range(r)) if r else -7.0), y
mats = [np.array([[1, i + 1], [0, 1]], np.int64).ravel() for i in range(P)]


def matmul(invec, inoutvec, dtype):          # inoutvec = invec @ inoutvec (2x2)
    inoutvec[:] = (invec.reshape(2, 2) @ inoutvec.reshape(2, 2)).ravel()


mm = polycast.Op.Create(matmul, commute=False)
y = np.empty(4, np.int64)
comm.Scan(mats[r], y, op=mm)
ref = mats[0].reshape(2, 2)
for i in range(1, r + 1):
    ref = ref @ mats[i].reshape(2, 2)
assert (y == ref.ravel()).all(), (y, ref)
z = mats[r].copy()
comm.Scan(polycast.IN_PLACE, z, op=mm)
assert (z == y).all()

# Bad counts: every rank raises, nothing moves, and the next call is in step
out = np.zeros(3 * P)
msg = expect_refusal(lambda: comm.Allgatherv(np.zeros(2 if r == 0 else 3), [out, [3] * P]),
                     "Allgatherv with a wrong sendbuf on rank 0")
assert "rank 0" in msg or "counts[0]" in msg, msg
bad = [2] * P if r != 1 else [3] * P
try:        # every rank has the counts (no agreement): they are in the call's signature
    comm.Allgatherv(np.zeros(bad[r]), [np.zeros(sum(bad)), bad])
    raise AssertionError(f"rank {r}: Allgatherv with counts that differ did not raise")
except MismatchError as exc:
    assert "differently" in str(exc), exc
rc_bad = list(rc)
if r == P - 1:
    rc_bad[0] += 1
rbig = np.zeros(sum(rc_bad) + P, np.int32)
expect_refusal(lambda: comm.Alltoallv([send, sc, sd], [rbig, rc_bad]),
               "Alltoallv whose receive counts do not match the sends")
expect_refusal(lambda: comm.Gatherv(np.zeros(2), [np.zeros(2 * P), [2] * (P - 1) + [3]]
                                    if r == 0 else None, 0),
               "Gatherv whose root counts do not match")
expect_refusal(lambda: comm.Reduce_scatter(np.zeros(P), np.zeros(1), [1] * (P + 1)),
               "Reduce_scatter with too many recvcounts")
expect_refusal(lambda: comm.Scan(np.zeros(2, bool), np.zeros(2, bool), op="avg"),
               "Scan with avg")
out = np.zeros(sum(cases[0]))
comm.Allgatherv(data(r, cases[0][r]), [out, cases[0]])
assert (out == np.concatenate([data(i, cases[0][i]) for i in range(P)])).all(), out

# Object forms
comm.barrier()
assert comm.alltoall([(r, i, "x" * i) for i in range(P)]) == [(j, r, "x" * r) for j in range(P)]
assert comm.scan(r + 1) == sum(range(1, r + 2))
assert comm.exscan([r]) == (None if r == 0 else [i for i in range(r)])
assert comm.reduce({r}, op=lambda a, b: a | b, root=P - 1) == (set(range(P)) if r == P - 1
                                                                 else None)

# Persistent collectives: the same call again and again, then another in between
x, y = np.zeros(8, np.float32), np.zeros(8, np.float32)
ar = comm.Allreduce_init(x, y, op="sum")
counts = [i + 1 for i in range(P)]
gv_out = np.zeros(sum(counts), np.int32)
gv = comm.Allgatherv_init(np.full(r + 1, r, np.int32), [gv_out, counts])
for step in range(5):
    x[:] = step + r
    ar.Start()
    ar.Wait()
    assert (y == sum(step + i for i in range(P))).all(), (step, y)
    gv_out[:] = -1
    gv.Start()
    try:
        gv.Start()
        raise AssertionError("Start of an active persistent request")
    except InvalidArgument:
        pass
    gv.Wait()
    assert (gv_out == np.repeat(np.arange(P, dtype=np.int32), counts)).all(), gv_out
ar.Free()

# auto on one host: mildly uneven calls may go padded through symmetric memory when the
# planner says so (once it is set up); very skewed ones always run the exact schedule
from polycast.collectives import Collective
comm.Allgather(np.ones(1 << 14, np.float32), np.empty(P << 14, np.float32))
for counts in ([1000 + i for i in range(P)], [1] * (P - 1) + [100000]):
    padded = comm._padded_symm_wins(Collective.ALLGATHER, counts, np.float32)
    assert not (padded and max(counts) > 1000 * min(counts)), counts
    out = np.zeros(sum(counts), np.float32)
    comm.Allgatherv(np.full(counts[r], r, np.float32), [out, counts])
    assert (out == np.repeat(np.arange(P), counts)).all(), (counts, out)
    rs = np.zeros(counts[r], np.float32)
    comm.Reduce_scatter(np.arange(sum(counts), dtype=np.float32), rs, counts)
    lo = sum(counts[:r])
    assert (rs == P * np.arange(lo, lo + counts[r])).all(), (counts, rs)
polycast.finalize()
print(f"VECTOR OK {r}")
