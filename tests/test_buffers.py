"""polycast.buffers in one process: mpi4py's message specs ([buf, count, displ, dtype] and the
vector calls' [buf, counts, displs, dtype]) as the flat elements a call uses, and the
InvalidArgument each unusable argument gets. The collectives run these on every rank; here
each rule is checked alone, without ranks (mpi4py's own suite, in the slow set, runs them
through real calls)."""
import array

import numpy as np
import pytest

from polycast import IN_PLACE, InvalidArgument
from polycast.buffers import (Vector, as_array, check_disjoint, dtype_name, message,
                              same_memory, vector)


def _same(got, want):
    assert got.dtype == want.dtype and got.tolist() == want.tolist()


# -- message: one buffer, mpi4py's spec forms -------------------------------------------------

A = np.arange(12, dtype=np.int32)


@pytest.mark.parametrize("spec,want", [
    (A, A),
    ([A, np.float32], A.view(np.float32)),                 # [buf, dtype]: the bytes as dtype
    ([A, "int16"], A.view(np.int16)),
    ([A, 5], A[:5]),                                       # [buf, count]
    ([A, (4, 3)], A[3:7]),                                 # [buf, (count, displ)]
    ((A, [4, 3]), A[3:7]),                                 # a list pair is (count, displ) too
    ([A, 6, np.int16], A.view(np.int16)[:6]),              # [buf, count, dtype]
    ([A, (2, 10), None], A[10:12]),                        # [buf, (count, displ), dtype]
    ([A, 2, 1, np.int32], A[1:3]),                         # [buf, count, displ, dtype]
    ([A, None, 4, None], A[4:]),                           # displ alone: the rest
])
def test_a_message_spec_is_the_elements_it_names(spec, want):
    _same(message(spec, "sendbuf"), want)


def test_blocks_multiply_the_count_and_must_divide_the_rest():
    _same(message([A, 2], "recvbuf", blocks=3), A[:6])     # 2 elements per rank, 3 ranks
    _same(message([A, None, 3, None], "recvbuf", blocks=3), A[3:])
    with pytest.raises(InvalidArgument, match="9 elements are not a multiple of the 2 ranks"):
        message([A, None, 3, None], "recvbuf", blocks=2)
    with pytest.raises(InvalidArgument, match="12 elements are not a multiple of the 5"):
        message(A, "recvbuf", blocks=5)                    # the flat-array shortcut checks too
    with pytest.raises(InvalidArgument, match="needs 15 elements from element 0"):
        message([A, 5], "recvbuf", blocks=3)


def test_the_empty_message_is_mpi4pys_bottom_with_count_zero():
    got = message([None, 0, np.float64], "sendbuf")
    assert got.size == 0 and got.dtype == np.float64
    assert message([None, 0], "sendbuf").dtype == np.uint8


def test_buffer_objects_and_layouts_are_viewed_not_copied():
    ba = bytearray(b"abcdefgh")
    got = message(ba, "recvbuf", writable=True)
    got[0] = ord("z")                                      # a view: writes reach the bytearray
    assert ba[:1] == b"z" and got.dtype == np.uint8
    arr = array.array("d", [1.0, 2.0, 3.0])
    _same(message([arr, 2], "sendbuf"), np.array([1.0, 2.0]))
    _same(message(memoryview(ba)[2:6], "sendbuf"), np.frombuffer(b"cdef", np.uint8))
    f = np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3))
    _same(message(f, "sendbuf"), f.ravel(order="K"))       # memory order, as MPI sends it
    c2 = np.arange(6, dtype=np.int64).reshape(2, 3)
    out = message(c2, "recvbuf", writable=True)
    out[4] = 40
    assert c2[1, 1] == 40


def test_dlpack_and_array_interface_objects_are_accepted():
    torch = pytest.importorskip("torch")
    t = torch.arange(5, dtype=torch.float32)
    got = message(t, "recvbuf", writable=True)
    got[0] = 7.0
    assert float(t[0]) == 7.0                              # the tensor's own memory

    class Iface:
        def __init__(self, a):
            self.__array_interface__ = a.__array_interface__
            self._a = a

    _same(message(Iface(A[:3]), "sendbuf"), A[:3])


@pytest.mark.parametrize("spec,what", [
    (None, "must be a buffer, got None"),
    (IN_PLACE, "must be a buffer, got polycast.IN_PLACE"),
    (object(), "must be a numpy array or a buffer"),
    (np.array([1, None], dtype=object), "holds Python objects"),
    (np.empty(0, dtype=[]), "of zero size"),
    (np.arange(12).reshape(3, 4)[:, ::2], "must be contiguous in memory"),
    (memoryview(np.arange(8))[::2], "must be contiguous in memory"),
    ([A, "no-such-dtype"], "is not a dtype"),
    ([A, np.dtype("V5")], "48 bytes are not a whole number of "),
    ([A, 2.5], "count must be an integer, got 2.5"),
    ([A, True], "count must be an integer, got True"),
    ([A, -1], "negative count -1"),
    ([A, (1, 2, 3)], r"expected \(count, displacement\), got \(1, 2, 3\)"),
    ([A, (1, 2, 3), None], r"expected \(count, displacement\)"),
    ([A, 1, 2, 3, 4], "a message spec has 2 to 4 items"),
    ([A, None, 13, None], "displacement 13 is past the buffer's 12 elements"),
    ([A, 3, 10, None], "needs 3 elements from element 10, the buffer has 12"),
])
def test_an_unusable_message_names_the_argument_and_the_problem(spec, what):
    with pytest.raises(InvalidArgument, match=what) as e:
        message(spec, "sendbuf")
    assert str(e.value).startswith("sendbuf")


def test_a_receive_buffer_must_be_writable():
    ro = np.arange(4)
    ro.flags.writeable = False
    for spec in (ro, [ro, 2], bytes(8)):
        with pytest.raises(InvalidArgument, match="recvbuf is read-only"):
            message(spec, "recvbuf", writable=True)
    _same(message(ro, "sendbuf"), ro)                      # a send buffer may be read-only


def test_a_device_buffer_is_refused_by_name():
    class Cuda:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, False),
                                    "version": 3}

    with pytest.raises(InvalidArgument, match="device \\(CUDA\\) buffers are not supported"):
        as_array(Cuda(), "sendbuf")


def test_a_buffer_format_numpy_cannot_read_needs_a_dtype():
    ptrs = memoryview(bytearray(16)).cast("P")            # void pointers: no numpy dtype
    with pytest.raises(InvalidArgument, match="buffer of format 'P' has no numpy dtype"):
        as_array(ptrs, "sendbuf")
    got = as_array(ptrs, "recvbuf", np.uint8, writable=True)    # its bytes, given a dtype
    assert got.size == 16 and got.flags.writeable


# -- vector: per-rank counts and displacements -------------------------------------------------

V = np.arange(10, dtype=np.float64)


@pytest.mark.parametrize("spec,counts,displs", [
    (V, (4, 3, 3), (0, 4, 7)),                             # cut as evenly as possible
    ([V, 2], (2, 2, 2), (0, 2, 4)),                        # one count for every rank
    ([V, [1, 2, 3]], (1, 2, 3), (0, 1, 3)),                # packed in rank order
    ([V, ([1, 2, 3], [7, 0, 3])], (1, 2, 3), (7, 0, 3)),   # [buf, (counts, displs)]
    ([V, [1, 1, 1], [0, 5, 9]], (1, 1, 1), (0, 5, 9)),     # [buf, counts, displs]
    ([V, 2, 3, None], (2, 2, 2), (0, 3, 6)),               # an integer displacement: a stride
    ([V, [2, 2, 2], np.float64], (2, 2, 2), (0, 2, 4)),    # [buf, counts, dtype]
    ([V, [4, 4, 4], None, np.float32], (4, 4, 4), (0, 4, 8)),
    ([V, ([1, 1, 1], 4)], (1, 1, 1), (0, 4, 8)),           # [buf, (counts, stride)]
])
def test_a_vector_spec_gives_each_ranks_block(spec, counts, displs):
    v = vector(spec, "sendbuf", 3)
    assert (v.counts, v.displs) == (counts, displs)
    assert v.packed == (displs == tuple(np.cumsum((0,) + counts[:-1]).tolist()))


@pytest.mark.parametrize("spec,what", [
    ([V, [1, 2]], "counts needs 3 entries \\(one per rank\\), got 2"),
    ([V, [1, 2, 3], [0, 1]], "displacements needs 3 entries"),
    ([V, [1, 2, 3], 2.0], "displacements must be a sequence of 3 integers or one integer"),
    ([V, [1, -2, 3]], "negative counts -2"),
    ([V, [1, 1, 1], [0, 1, 9.5]], "displacements must be an integer, got 9.5"),
    ([V, [4, 4, 4]], r"rank 2's block \[8, 12\) is past the buffer's 10 elements"),
    ([V, 1, [0, 1, 10]], r"rank 2's block \[10, 11\) is past"),
    ([V, ([1, 2, 3], 4)], r"rank 2's block \[8, 11\) is past"),  # (counts, stride)
])
def test_an_unusable_vector_names_the_argument_and_the_problem(spec, what):
    with pytest.raises(InvalidArgument, match=what):
        vector(spec, "sendbuf", 3)


def test_counts_must_be_a_sequence_or_one_integer():
    with pytest.raises(InvalidArgument, match="counts must be a sequence of 3 integers or one "
                                              "integer, got 2.5"):
        vector([V, 2.5], "recvbuf", 3)


def test_empty_blocks_may_point_anywhere():
    v = vector([V, [0, 10, 0], [99, 0, 99]], "recvbuf", 3)  # count 0: displacement unused
    assert v.counts == (0, 10, 0) and not v.packed
    assert isinstance(v, Vector) and v.array is not None


# -- aliasing and names ------------------------------------------------------------------------

def test_same_memory_is_the_very_same_elements():
    a = np.arange(8)
    assert same_memory(a, a) and same_memory(a, a[:])
    assert not same_memory(a[:4], a[4:])                   # disjoint halves
    assert not same_memory(a[:4], a[1:5])                  # overlapping, not the same
    assert not same_memory(a, np.arange(8))


def test_overlapping_send_and_receive_buffers_are_refused():
    a = np.arange(8)
    check_disjoint(a[:4], a[4:], "Allreduce")              # disjoint: fine
    check_disjoint(a[:0], a, "Allreduce")                  # nothing to read: fine
    with pytest.raises(InvalidArgument, match="Allreduce: sendbuf and recvbuf overlap"):
        check_disjoint(a[:5], a[4:], "Allreduce")


def test_dtype_names_are_numpys_and_kept():
    dt = np.dtype(np.float32)
    assert dtype_name(dt) == "float32" and dtype_name(dt) is dtype_name(np.dtype("float32"))
    assert repr(IN_PLACE) == "polycast.IN_PLACE"
