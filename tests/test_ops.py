"""polycast.ops: predefined and user ops, dtype rules, and their use by the engine's memory
operations (a ring allreduce over the engine's test world)."""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from world import World  # noqa: E402

from polycast import ops  # noqa: E402
from polycast.algorithms import build  # noqa: E402
from polycast.comm.ordered import fold  # noqa: E402
from polycast.errors import InvalidArgument, UnknownName  # noqa: E402


def _allreduce(P, inputs, op, algo="ring"):
    w = World(P)
    s = build("allreduce", algo, P, inputs[0].size)
    outs = [np.zeros_like(x) for x in inputs]
    for r in range(P):
        w.post(r, s, inputs[r], outs[r], op)
    w.run()
    assert not w.errors, w.errors
    return outs


@pytest.mark.parametrize("algo", ["ring", "recdoubling", "binomial"])
def test_bitwise_and_logical_ops_through_the_engine(algo):
    P = 4
    xs = [np.array([0b1111 ^ (1 << r), r, 0, 7], np.int32) for r in range(P)]
    want = {"band": np.bitwise_and.reduce(xs), "bor": np.bitwise_or.reduce(xs),
            "bxor": np.bitwise_xor.reduce(xs),
            "land": np.logical_and.reduce(xs).astype(np.int32),
            "lor": np.logical_or.reduce(xs).astype(np.int32),
            "lxor": np.logical_xor.reduce(xs).astype(np.int32)}
    for name, w in want.items():
        for out in _allreduce(P, xs, name, algo):
            np.testing.assert_array_equal(out, w, err_msg=name)


def test_maxloc_minloc_on_pairs_prefer_the_lowest_index_on_ties():
    P = 4
    pt = ops.pair_dtype("f8", "i4")
    xs = []
    for r in range(P):
        x = np.zeros(3, pt)
        x["value"] = [r % 2, -r, 5.0]
        x["index"] = r
        xs.append(x)
    for out in _allreduce(P, xs, ops.MAXLOC):
        assert out.tolist() == [(1.0, 1), (0.0, 0), (5.0, 0)]
    for out in _allreduce(P, xs, ops.MINLOC):
        assert out.tolist() == [(0.0, 0), (-3.0, 3), (5.0, 0)]


def test_user_op_through_the_engine():
    def absmax(invec, inoutvec, dtype):
        np.maximum(np.abs(invec), np.abs(inoutvec), out=inoutvec)
    ABSMAX = ops.Op.Create(absmax, commute=True)
    xs = [np.array([-(r + 1.0), r, -0.5], np.float64) for r in range(3)]
    for out in _allreduce(3, xs, ABSMAX):
        assert out.tolist() == [3.0, 2.0, 0.5]
    assert ABSMAX.name.startswith("user:") and ABSMAX.Is_commutative()
    ABSMAX.Free()
    with pytest.raises(InvalidArgument, match="freed"):
        ops.get(ABSMAX)


def test_ops_refuse_dtypes_they_cannot_take():
    for op, dt in ((ops.BAND, np.float32), (ops.MAX, np.complex64), (ops.SUM, np.bool_),
                   (ops.MAXLOC, np.float64), (ops.AVG, np.bool_)):
        with pytest.raises(InvalidArgument, match=op.name):
            op.check(np.dtype(dt))
    with pytest.raises(InvalidArgument, match="integer index"):
        ops.MINLOC.check(np.dtype([("v", "f8"), ("i", "f8")]))
    with pytest.raises(UnknownName, match="band"):
        ops.get("nope")
    ops.LOR.check(np.dtype(bool))
    ops.SUM.check(np.dtype(np.complex128))


def test_non_commutative_fold_is_in_rank_order():
    def left(invec, inoutvec, dtype):       # a op b = a: associative, not commutative
        inoutvec[...] = invec

    def right(invec, inoutvec, dtype):      # a op b = b
        pass
    L, R = ops.Op.Create(left), ops.Op.Create(right)
    parts = [np.full(2, r) for r in range(5)]
    out = np.empty(2, int)
    fold(parts, L, out)
    assert out.tolist() == [0, 0]
    fold(parts, R, out)
    assert out.tolist() == [4, 4]
    assert not L.Is_commutative()


def test_ops_on_python_objects():
    assert ops.SUM(2, 3) == 5 and ops.MAX("a", "b") == "b" and ops.BXOR(6, 3) == 5
    assert ops.MAXLOC((1.0, 3), (1.0, 2)) == (1.0, 2)
    assert ops.MINLOC((0.5, 3), (1.0, 2)) == (0.5, 3)


# -- Op.Reduce_local (mpi4py's), in this process ------------------------------------------------

def test_reduce_local_builtin_op_combines_inbuf_into_inoutbuf():
    a = np.array([1, 5, 3], dtype=np.int64)
    b = np.array([4, 2, 6], dtype=np.int64)
    ops.SUM.Reduce_local(a, b)
    assert b.tolist() == [5, 7, 9] and a.tolist() == [1, 5, 3]
    with warnings.catch_warnings():
        warnings.simplefilter("error")                     # np.maximum takes out= by keyword
        ops.MAX.Reduce_local([a, 2], [b, 2])                   # message specs: the first 2 elements
        assert b.tolist() == [5, 7, 9]
        ops.MAX.Reduce_local(np.array([9, 0]), [b, (2, 1)])    # (count, displacement)
        assert b.tolist() == [5, 9, 9]


def test_reduce_local_user_op_result_lands_in_inoutbuf_whether_returned_or_written():
    returned = ops.Op.Create(lambda x, y, dt: x * 10 + y, commute=False)
    in_place = ops.Op.Create(lambda x, y, dt: np.subtract(y, x, out=y))
    b = np.array([1.0, 2.0])
    returned.Reduce_local(np.array([3.0, 4.0]), b)
    assert b.tolist() == [31.0, 42.0]
    in_place.Reduce_local(np.array([1.0, 2.0]), b)
    assert b.tolist() == [30.0, 40.0]
    returned.Free()
    in_place.Free()


def test_reduce_local_refuses_buffers_that_do_not_match():
    with pytest.raises(InvalidArgument, match=r"Reduce_local: inbuf \(3 x int64\) and "
                                              r"inoutbuf \(2 x int64\) must match"):
        ops.SUM.Reduce_local(np.zeros(3, np.int64), np.zeros(2, np.int64))
    with pytest.raises(InvalidArgument, match="must match"):
        ops.SUM.Reduce_local(np.zeros(2, np.int32), np.zeros(2, np.int64))
    with pytest.raises(InvalidArgument, match="inoutbuf is read-only"):
        ops.SUM.Reduce_local(np.zeros(2), _ro())
    with pytest.raises(InvalidArgument, match="Reduce_local: "):
        ops.SUM.Reduce_local(np.zeros(2, bool), np.zeros(2, bool))   # sum has no booleans


def _ro():
    r = np.zeros(2)
    r.flags.writeable = False
    return r
