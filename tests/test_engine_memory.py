"""polycast.memory (the drivers' memory operations) and polycast.reference."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from world import World, ring_allgather, ring_reduce_scatter  # noqa: E402

from polycast.engine.actions import Region  # noqa: E402
from polycast.errors import InvalidArgument  # noqa: E402
from polycast.memory import Buffers, apply_avg  # noqa: E402
from polycast.reference import DTYPES, make_inputs, reference  # noqa: E402


def reg(nelems_send=8, P=2, dtype=np.float32, send=None, recv=None):
    s = ring_allgather(P, nelems_send)
    b = Buffers()
    send = np.arange(nelems_send, dtype=dtype) if send is None else send
    recv = np.zeros(P * nelems_send, dtype) if recv is None else recv
    b.register(0, s, 0, send, recv)
    return b, send, recv


def R(buf, runs, isz=4):
    return Region(0, buf, tuple(runs), sum(b - a for a, b in runs) * isz)


def test_gather_is_zero_copy_for_one_run_and_joins_several():
    b, send, _ = reg()
    g = b.gather(R("send", [(2, 5)]))
    assert isinstance(g, memoryview) and g.nbytes == 12
    send[2] = 42
    assert np.frombuffer(g, np.float32)[0] == 42            # a view, not a copy
    joined = b.gather(R("send", [(0, 1), (6, 8)]))
    np.testing.assert_array_equal(np.frombuffer(joined, np.float32), [0, 6, 7])


def test_deliver_overwrites_or_reduces_across_runs():
    b, _, recv = reg()
    payload = np.array([1, 2, 3, 4], np.float32).tobytes()
    region = R("recv", [(0, 1), (5, 8)])
    b.deliver(region, payload, False)
    np.testing.assert_array_equal(recv[[0, 5, 6, 7]], [1, 2, 3, 4])
    b._reqs[0].ufunc = np.add
    b.deliver(region, payload, True)
    np.testing.assert_array_equal(recv[[0, 5, 6, 7]], [2, 4, 6, 8])
    with pytest.raises(InvalidArgument, match="payload of 3 elements for a region of 4"):
        b.deliver(region, payload[:12], False)


def test_copy_with_unaligned_run_boundaries():
    b, send, recv = reg()
    b.copy(R("send", [(0, 3), (3, 8)]), R("recv", [(8, 10), (10, 16)]), False)
    np.testing.assert_array_equal(recv[8:], send)


def test_copy_in_place_is_a_no_op_and_overlap_is_safe():
    recv = np.arange(16, dtype=np.float32)
    send = recv[8:16]                       # MPI_IN_PLACE style: send is recv's block 1
    s = ring_allgather(2, 8)
    b = Buffers()
    b.register(0, s, 1, send, recv)
    before = recv.copy()
    b.copy(R("send", [(0, 8)]), R("recv", [(8, 16)]), False)
    np.testing.assert_array_equal(recv, before)
    # overlapping but shifted: the result is as if read fully before writing
    b.copy(R("recv", [(0, 10)]), R("recv", [(2, 12)]), False)
    np.testing.assert_array_equal(recv[2:12], before[0:10])


@pytest.mark.parametrize("dtype", ["int32", "int8", "float16", "float64"])
def test_avg_matches_reference(dtype):
    x = np.array([7, -7, 3, 0], dtype)
    y = x.copy()
    apply_avg(y, 2)
    want = np.floor_divide(x, 2) if np.dtype(dtype).kind == "i" else x / np.array(2, dtype)
    np.testing.assert_array_equal(y, want.astype(dtype))


@pytest.mark.parametrize("coll", ["broadcast", "reduce", "allreduce", "allgather",
                                  "reduce_scatter", "scatter", "gather", "alltoall"])
def test_reference_shapes_and_exactness(coll):
    P, count = 3, 4
    for dtype in DTYPES:
        xs = make_inputs(coll, P, count, dtype, root=1, seed=2, op="sum")
        out = reference(coll, xs, root=1, op="sum")
        assert len(out) == P
        for r, o in enumerate(out):
            if coll in ("reduce", "gather") and r != 1:
                assert o is None
                continue
            assert o.dtype == np.dtype(dtype)
    xs = make_inputs("alltoall", 2, 2, "int32", seed=1)
    out = reference("alltoall", xs)
    np.testing.assert_array_equal(out[0], np.concatenate([xs[0][:2], xs[1][:2]]))
    np.testing.assert_array_equal(out[1], np.concatenate([xs[0][2:], xs[1][2:]]))


def test_make_inputs_deterministic_and_small():
    a = make_inputs("allreduce", 16, 100, "float16", seed=3, op="sum")
    b = make_inputs("allreduce", 16, 100, "float16", seed=3, op="sum")
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert max(np.abs(x).max() for x in a) <= 4
    # the float16 sum is exact: same in float64
    s16 = reference("allreduce", a)[0].astype(np.float64)
    s64 = reference("allreduce", [x.astype(np.float64) for x in a])[0]
    np.testing.assert_array_equal(s16, s64)
    with pytest.raises(InvalidArgument, match="unknown dtype"):
        make_inputs("allreduce", 2, 2, "float17")


def test_reduce_scatter_avg_through_the_world():
    P = 4
    w = World(P)
    c = w.post_call(ring_reduce_scatter(P, 5), "float32", op="avg")
    w.run()
    w.check(c)
