"""The symm path's compiled helper (polycast/runtime/symm/_symm.c) in one process: P
``Barrier`` objects over the same control blocks and slots play the P ranks. Its folds give
numpy's bits for every dtype and op it takes, mismatched descriptors copy nothing out, waits
return (bounded) while a peer is missing, and its layout is the Python barrier's. Skipped,
saying why, where the helper was not built."""

from __future__ import annotations

import numpy as np
import pytest

from polycast.collectives import ReduceOp
from polycast.runtime.symm import barrier as B
from polycast.runtime.symm.common import UFUNCS, fold_in_rank_order
from polycast.runtime.symm.staged import _DTYPE_CODES, _OP_CODES
from polycast.runtime.transport.wait import WaitPolicy

pytestmark = pytest.mark.skipif(B.compiled is None,
                                reason=f"compiled symm helper not in use: {B.compiled_why_not}")

# Wait policies as the helper takes them: none at all; spin 1 ms then yield to 5 ms; sleep at
# once on a futex; nap without futexes.
NOWAIT = WaitPolicy(0.0, 0.0, 0.0, futex=False).c_args
SPIN_THEN_YIELD = WaitPolicy(1e-3, 1.0, 4e-3).c_args
SLEEP_AT_ONCE = WaitPolicy().passive().c_args
NAP = WaitPolicy(futex=False).passive().c_args
HALF = 4096             # bytes per slot


class Ranks:
    """P compiled barriers over one set of control blocks and slots segments."""

    def __init__(self, P: int) -> None:
        self.P = P
        self.ctrl = [np.zeros(B.CTRL_NBYTES // 8, np.uint64) for _ in range(P)]
        self.slots = [np.zeros(2 * HALF, np.uint8) for _ in range(P)]
        self.bars = []
        for r in range(P):
            b = B.compiled.Barrier(r, [c.ctypes.data for c in self.ctrl])
            b.set_slots([s.ctypes.data for s in self.slots], HALF)
            self.bars.append(b)

    def call(self, kind, e, sigs, srcs, dsts, root=0, t=0, op=0):
        """Every rank starts (the last to arrive finishes at once), then the others
        finish; returns every rank's return code."""
        rcs = []
        for r in range(self.P):
            rcs.append(self.bars[r].start(kind, e, sigs[r], srcs[r], dsts[r], root, t, op,
                                          NOWAIT))
        assert rcs[-1] in (0, -1) and all(rc > 0 for rc in rcs[:-1])
        for r in range(self.P - 1):
            rcs[r] = self.bars[r].finish(kind, e, srcs[r], dsts[r], root, t, op)
        return rcs


DTYPES = [np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8,
          np.uint16, np.uint32, np.uint64]
OPS = [ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX]


def _inputs(rng, dt, n, P):
    dt = np.dtype(dt)
    if dt.kind == "f":      # values whose sums round: rank order matters for the bits
        return [(rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(dt)
                for _ in range(P)]
    info = np.iinfo(dt)
    return [rng.integers(info.min, info.max, n, dtype=dt, endpoint=True) for _ in range(P)]


@pytest.mark.parametrize("P", [2, 3, 4])
@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
def test_allreduce_and_reduce_scatter_fold_like_numpy(P, dt):
    rng = np.random.default_rng(P)
    R = Ranks(P)
    e = 0
    for op in OPS:
        t, o = _DTYPE_CODES[np.dtype(dt).str], _OP_CODES[op]
        if not B.compiled.supports(t, o):
            assert np.dtype(dt).kind == "f" and op in (ReduceOp.MIN, ReduceOp.MAX)
            continue
        n = 37 * P
        xs = _inputs(rng, dt, n, P)
        want = np.empty(n, dt)
        with np.errstate(over="ignore"):
            fold_in_rank_order(UFUNCS[op], xs, want, op, P)
        e += 1
        outs = [np.empty(n, dt) for _ in range(P)]
        assert R.call(B.K_ALLREDUCE, e, [9] * P, xs, outs, 0, t, o) == [0] * P
        for out in outs:
            assert out.tobytes() == want.tobytes(), (np.dtype(dt), op)
        # reduce-scatter: rank r folds block r, its own copy first then the peers rotated
        e += 1
        m = n // P
        parts = [np.empty(m, dt) for _ in range(P)]
        assert R.call(B.K_REDUCE_SCATTER, e, [5] * P, xs, parts, 0, t, o) == [0] * P
        for r in range(P):
            blocks = [xs[(r + i) % P][r * m:(r + 1) * m] for i in range(P)]
            exp = np.empty(m, dt)
            with np.errstate(over="ignore"):
                fold_in_rank_order(UFUNCS[op], blocks, exp, op, P)
            assert parts[r].tobytes() == exp.tobytes()


def test_float_min_max_are_left_to_numpy():
    for t in (_DTYPE_CODES["<f4"], _DTYPE_CODES["<f8"]):
        assert not B.compiled.supports(t, _OP_CODES[ReduceOp.MIN])
        assert not B.compiled.supports(t, _OP_CODES[ReduceOp.MAX])


@pytest.mark.parametrize("P", [2, 4])
def test_bcast_allgather_and_in_place(P):
    R = Ranks(P)
    rng = np.random.default_rng(1)
    root = P - 1
    data = rng.standard_normal(100)
    bufs = [data.copy() if r == root else np.zeros(100) for r in range(P)]
    srcs = [bufs[r] if r == root else None for r in range(P)]
    dsts = [None if r == root else bufs[r] for r in range(P)]
    assert R.call(B.K_BCAST, 1, [3] * P, srcs, dsts, root) == [0] * P
    for b in bufs:
        assert np.array_equal(b, data)
    blocks = [rng.integers(0, 99, 10, dtype=np.int16) for _ in range(P)]
    outs = [np.zeros(10 * P, np.int16) for _ in range(P)]
    assert R.call(B.K_ALLGATHER, 2, [4] * P, blocks, outs) == [0] * P
    for o in outs:
        assert np.array_equal(o, np.concatenate(blocks))
    # in place: the send block is the recv buffer's own block
    outs = [np.concatenate(blocks) * (r == 0) for r in range(P)]
    for r in range(P):
        outs[r][r * 10:(r + 1) * 10] = blocks[r]
    srcs = [outs[r][r * 10:(r + 1) * 10] for r in range(P)]
    assert R.call(B.K_ALLGATHER, 3, [4] * P, srcs, outs) == [0] * P
    for o in outs:
        assert np.array_equal(o, np.concatenate(blocks))


def test_mismatched_descriptors_copy_nothing_on_any_rank():
    P = 3
    R = Ranks(P)
    xs = [np.full(8, r + 1.0, np.float32) for r in range(P)]
    outs = [np.full(8, -7.0, np.float32) for _ in range(P)]
    t, o = _DTYPE_CODES["<f4"], _OP_CODES[ReduceOp.SUM]
    assert R.call(B.K_ALLREDUCE, 1, [1, 1, 2], xs, outs, 0, t, o) == [-1] * P
    for out in outs:
        assert (out == -7.0).all()
    # the barrier stays in step: the next, matching call works
    assert R.call(B.K_ALLREDUCE, 2, [1] * P, xs, outs, 0, t, o) == [0] * P
    assert all((out == 6.0).all() for out in outs)


def test_a_wait_for_a_missing_peer_returns_within_its_bounds():
    import time
    R = Ranks(2)
    x, out = np.ones(4, np.float32), np.zeros(4, np.float32)
    t, o = _DTYPE_CODES["<f4"], _OP_CODES[ReduceOp.SUM]
    t0 = time.monotonic()
    # spin 1 ms, yield to 5 ms: rank 1 never arrives
    assert R.bars[0].start(B.K_ALLREDUCE, 1, 9, x, out, 0, t, o, SPIN_THEN_YIELD) == 1
    # then a futex sleep of 20 ms on its epoch, and a nap without futexes
    assert R.bars[0].wait(-1, B.EPOCH, 1, SLEEP_AT_ONCE, 0.02) == 1
    assert R.bars[0].wait(1, B.EPOCH, 1, NAP, 0.01) == 1
    took = time.monotonic() - t0
    assert 0.035 <= took < 1.0, took
    assert R.ctrl[0][B.SLEEP] == 0          # the sleep flag is down again
    assert (out == 0).all()
    # rank 1 arrives: rank 0's wait returns at once and it finishes
    assert R.bars[1].start(B.K_ALLREDUCE, 1, 9, x, out * 0 + x, 0, t, o, NOWAIT) == 0
    assert R.bars[0].wait(-1, B.EPOCH, 1, SLEEP_AT_ONCE, 1.0) == 0
    assert R.bars[0].finish(B.K_ALLREDUCE, 1, x, out, 0, t, o) == 0
    assert (out == 2).all()


def test_buffers_that_do_not_fit_are_refused_before_anything_is_published():
    R = Ranks(2)
    big = np.zeros(HALF // 4 + 1, np.float32)
    t, o = _DTYPE_CODES["<f4"], _OP_CODES[ReduceOp.SUM]
    with pytest.raises(ValueError):
        R.bars[0].start(B.K_ALLREDUCE, 1, 9, big, big.copy(), 0, t, o, NOWAIT)
    with pytest.raises(ValueError):      # sizes differ
        R.bars[0].start(B.K_ALLREDUCE, 1, 9, np.zeros(4, np.float32),
                        np.zeros(5, np.float32), 0, t, o, NOWAIT)
    assert R.ctrl[0][B.EPOCH] == 0


def test_layout_is_the_python_barriers():
    """A compiled rank and a Python rank (EpochBarrier's own stores) meet at one epoch."""
    R = Ranks(2)
    x, out = np.ones(4, np.float32), np.zeros(4, np.float32)
    t, o = _DTYPE_CODES["<f4"], _OP_CODES[ReduceOp.SUM]
    assert R.bars[0].start(B.K_ALLREDUCE, 1, 77, x, out, 0, t, o, NOWAIT) == 1
    # rank 1 as barrier.py does it: data in slot (1 & 1), descriptor, then the epoch
    R.slots[1][HALF:HALF + 16] = np.full(4, 2.0, np.float32).view(np.uint8)
    R.ctrl[1][B.SIG0 // 8 + 1] = 77
    R.ctrl[1][B.EPOCH] = 1
    assert R.bars[0].finish(B.K_ALLREDUCE, 1, x, out, 0, t, o) == 0
    assert (out == 3).all()
    assert R.ctrl[0][B.EPOCH] == 1 and R.ctrl[0][B.SIG0 // 8 + 1] == 77
    assert (R.slots[0][HALF:HALF + 16].view(np.float32) == 1).all()
