"""What a communicator accepts as a buffer, and the per-call names it hands the driver.

A buffer is a numpy array, any object with the buffer protocol (``bytearray``,
``array.array``, ``memoryview``) or a CPU DLPack object (a torch CPU tensor), in memory
order (C- or Fortran-contiguous). As in mpi4py, a buffer may also be given as a message
spec, a list or tuple:

=================================== ==================================================
``buf``                              every element, dtype from the buffer
``[buf, dtype]``                     the buffer's bytes as ``dtype`` (numpy dtype-like)
``[buf, count]``                     ``count`` elements (per rank, where a call has blocks)
``[buf, count, dtype]``              both
``[buf, (count, displ), dtype]``     ``count`` elements from element ``displ``
``[buf, count, displ, dtype]``       the same
=================================== ==================================================

and the vector calls (``Gatherv``, ``Alltoallv``...) take ``[buf, counts]``,
``[buf, (counts, displs)]``, ``[buf, counts, displs]`` or ``[buf, counts, displs, dtype]``
(``counts`` a sequence, or one integer for every rank; ``displs`` a sequence, one integer
stride, or omitted for blocks packed in rank order).

Elements must have a fixed size (no ``object`` dtypes: use the lowercase methods for Python
objects). Arguments a call cannot use raise :class:`~polycast.InvalidArgument` naming the
argument and the problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

import numpy as np

from .errors import InvalidArgument


class _InPlace:
    def __repr__(self) -> str:
        return "polycast.IN_PLACE"


IN_PLACE = _InPlace()


# Per-call constants, computed once (str(dtype) alone measured ~5 us, a third of the
# comm layer's cost of an 8-byte allreduce).
_DTYPE_NAMES: dict = {}


def dtype_name(dt: np.dtype) -> str:
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = _DTYPE_NAMES[dt] = str(dt)
    return name


def _dtype(spec, what: str) -> np.dtype:
    try:
        dt = np.dtype(spec)
    except TypeError:
        raise InvalidArgument(f"{what}: {spec!r} is not a dtype (give a numpy dtype, its "
                              f"name or an object with a .dtype)") from None
    check_dtype(dt, what)
    return dt


def check_dtype(dt: np.dtype, what: str) -> None:
    if dt.hasobject:
        raise InvalidArgument(f"{what} has dtype {dt}, which holds Python objects, not "
                              "bytes: send them with the lowercase methods (comm.allreduce, "
                              "comm.bcast, ...)")
    if dt.itemsize == 0:
        raise InvalidArgument(f"{what} has dtype {dt!r} of zero size")


def _flat(arr: np.ndarray, what: str) -> np.ndarray:
    """A 1-D view of ``arr`` in memory order, or InvalidArgument."""
    if arr.ndim <= 1 and (arr.flags.c_contiguous or arr.size <= 1):
        return arr.reshape(-1)
    if arr.flags.c_contiguous:
        return arr.reshape(-1)
    if arr.flags.f_contiguous:
        return arr.ravel(order="K")
    raise InvalidArgument(f"{what} must be contiguous in memory (use np.ascontiguousarray)")


def as_array(buf, what: str, dtype=None, *, writable: bool = False) -> np.ndarray:
    """``buf`` (an array or buffer object, no spec) as a flat numpy view, optionally
    reinterpreted as ``dtype``; InvalidArgument naming ``what`` is wrong with it."""
    if isinstance(buf, np.ndarray):
        arr = buf
    elif buf is None or buf is IN_PLACE:
        raise InvalidArgument(f"{what} must be a buffer, got {buf!r}")
    elif hasattr(buf, "__cuda_array_interface__") and not hasattr(buf, "__array_interface__"):
        raise InvalidArgument(f"{what}: device (CUDA) buffers are not supported; polycast "
                              "moves host memory")
    else:
        try:
            mv = memoryview(buf)
        except TypeError:
            mv = None
        if mv is not None:
            if not (mv.c_contiguous or mv.f_contiguous):
                raise InvalidArgument(f"{what} must be contiguous in memory")
            try:
                arr = np.asarray(mv)
            except (ValueError, TypeError, NotImplementedError) as exc:
                if dtype is None:
                    raise InvalidArgument(f"{what}: buffer of format {mv.format!r} has no "
                                          f"numpy dtype ({exc}); give one: [buf, dtype]"
                                          ) from None
                arr = np.frombuffer(mv.cast("B"), np.uint8)   # writable if mv is
        elif hasattr(buf, "__dlpack__"):
            try:
                arr = np.from_dlpack(buf)
            except (TypeError, ValueError, RuntimeError, BufferError) as exc:
                raise InvalidArgument(f"{what}: DLPack object not usable as a host array: "
                                      f"{exc}") from None
        elif hasattr(buf, "__array_interface__") or hasattr(buf, "__array__"):
            arr = np.asarray(buf)
        else:
            raise InvalidArgument(f"{what} must be a numpy array or a buffer (or "
                                  f"polycast.IN_PLACE where allowed), got "
                                  f"{type(buf).__name__}")
    check_dtype(arr.dtype, what)
    flat = _flat(arr, what)
    if dtype is not None:
        dt = _dtype(dtype, what)
        if dt != flat.dtype:
            if flat.nbytes % dt.itemsize:
                raise InvalidArgument(f"{what}: {flat.nbytes} bytes are not a whole number "
                                      f"of {dt} elements ({dt.itemsize} bytes)")
            flat = flat.view(np.uint8).view(dt)
    if writable and not flat.flags.writeable:
        raise InvalidArgument(f"{what} is read-only; a receive buffer must be writable")
    return flat


def _index(v, what: str, name: str) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (Integral, np.integer)):
        raise InvalidArgument(f"{what}: {name} must be an integer, got {v!r}")
    v = int(v)
    if v < 0:
        raise InvalidArgument(f"{what}: negative {name} {v}")
    return v


def _is_dtype_like(x) -> bool:
    if x is None or isinstance(x, (Integral, np.integer, list, tuple)):
        return False
    if isinstance(x, (np.dtype, str, type)) or hasattr(x, "dtype"):
        return True
    return False


def _unpack(msg, what: str, vector: bool):
    """(buf, count(s), displ(s), dtype) of a message spec (mpi4py's rules)."""
    if not isinstance(msg, (list, tuple)):
        return msg, None, None, None
    n = len(msg)
    count = displ = dtype = None
    if n == 2:
        buf, count = msg
        if _is_dtype_like(count):
            count, dtype = None, count
        elif isinstance(count, tuple) or (not vector and isinstance(count, list)):
            if len(count) != 2:
                raise InvalidArgument(f"{what}: expected (count, displacement), got {count!r}")
            count, displ = count
    elif n == 3:
        buf, count, dtype = msg
        if isinstance(count, tuple) or (not vector and isinstance(count, list)):
            if len(count) != 2:
                raise InvalidArgument(f"{what}: expected (count, displacement), got {count!r}")
            count, displ = count
        elif vector and not _is_dtype_like(dtype) and dtype is not None:
            displ, dtype = dtype, None          # [buf, counts, displs]
    elif n == 4:
        buf, count, displ, dtype = msg
    else:
        raise InvalidArgument(f"{what}: a message spec has 2 to 4 items "
                              f"([buf, count, displ, dtype]), got {n}")
    return buf, count, displ, dtype


def message(msg, what: str, *, blocks: int = 1, writable: bool = False) -> np.ndarray:
    """A buffer argument (array, buffer or spec) as the flat array of elements the call
    uses: ``blocks`` equal blocks of ``count`` elements from ``displ`` (count defaults to
    the buffer's elements from ``displ`` divided by ``blocks``)."""
    if type(msg) is np.ndarray and msg.ndim == 1 and msg.flags.c_contiguous:
        # The common case (a flat array, no spec) without the general path's steps:
        # as_array's checks in the same order, then the blocks' (an allgather's recvbuf
        # took the general path: ~3 us of a 1 MiB auto allgather's ~100).
        check_dtype(msg.dtype, what)
        if writable and not msg.flags.writeable:
            raise InvalidArgument(f"{what} is read-only; a receive buffer must be writable")
        if blocks > 1 and msg.size % blocks:
            raise InvalidArgument(f"{what}: {msg.size} elements are not a multiple of the "
                                  f"{blocks} ranks")
        return msg
    buf, count, displ, dtype = _unpack(msg, what, vector=False)
    if buf is None and count == 0 and isinstance(msg, (list, tuple)):
        # [None, 0, dtype]: mpi4py's empty message (MPI_BOTTOM with count 0)
        return np.empty(0, _dtype(dtype, what) if dtype is not None else np.uint8)
    arr = as_array(buf, what, dtype, writable=writable)
    lo = 0 if displ is None else _index(displ, what, "displacement")
    if lo > arr.size:
        raise InvalidArgument(f"{what}: displacement {lo} is past the buffer's {arr.size} "
                              "elements")
    if count is None:
        n = arr.size - lo
        if blocks > 1 and n % blocks:
            raise InvalidArgument(f"{what}: {n} elements are not a multiple of the "
                                  f"{blocks} ranks")
        return arr[lo:]
    count = _index(count, what, "count")
    hi = lo + count * blocks
    if hi > arr.size:
        raise InvalidArgument(f"{what}: needs {count * blocks} elements from element {lo}, "
                              f"the buffer has {arr.size}")
    return arr[lo:hi]


@dataclass(frozen=True)
class Vector:
    """A vector-call buffer: per-rank element counts and displacements into ``array``."""

    array: np.ndarray
    counts: tuple[int, ...]
    displs: tuple[int, ...]

    @property
    def packed(self) -> bool:
        """Blocks laid end to end in rank order from element 0."""
        pos = 0
        for c, d in zip(self.counts, self.displs):
            if d != pos:
                return False
            pos += c
        return True


def _int_seq(v, n: int, what: str, name: str) -> tuple[int, ...]:
    try:
        items = list(v)
    except TypeError:
        raise InvalidArgument(f"{what}: {name} must be a sequence of {n} integers or one "
                              f"integer, got {v!r}") from None
    if len(items) != n:
        raise InvalidArgument(f"{what}: {name} needs {n} entries (one per rank), got "
                              f"{len(items)}")
    return tuple(_index(x, what, name) for x in items)


def vector(msg, what: str, nranks: int, *, writable: bool = False) -> Vector:
    """A vector-call buffer argument with its per-rank counts and displacements (mpi4py's
    rules: counts default to the buffer cut as evenly as possible, displacements to the
    blocks packed in rank order; an integer displacement is a stride)."""
    buf, counts, displs, dtype = _unpack(msg, what, vector=True)
    arr = as_array(buf, what, dtype, writable=writable)
    if counts is None:
        q, rem = divmod(arr.size, nranks)
        cs = tuple(q + (i < rem) for i in range(nranks))
    elif isinstance(counts, (Integral, np.integer)):
        cs = (_index(counts, what, "count"),) * nranks
    else:
        cs = _int_seq(counts, nranks, what, "counts")
    if displs is None:
        ds, pos = [], 0
        for c in cs:
            ds.append(pos)
            pos += c
        ds = tuple(ds)
    elif isinstance(displs, (Integral, np.integer)):
        stride = _index(displs, what, "displacement stride")
        ds = tuple(stride * i for i in range(nranks))
    else:
        ds = _int_seq(displs, nranks, what, "displacements")
    for i, (c, d) in enumerate(zip(cs, ds)):
        if c and d + c > arr.size:
            raise InvalidArgument(f"{what}: rank {i}'s block [{d}, {d + c}) is past the "
                                  f"buffer's {arr.size} elements")
    return Vector(arr, cs, ds)


def same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """``a`` and ``b`` are the very same elements (aliased arguments, as IN_PLACE)."""
    if a.nbytes != b.nbytes or not (a is b or np.may_share_memory(a, b)):
        return False            # (the addresses below cost ~1 us: only when they may be)
    return a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


def check_disjoint(send: np.ndarray, recv: np.ndarray, call: str) -> None:
    """Input and output buffers that partly overlap give undefined results in MPI and
    wrong ones here: refuse them (identical ones are handled as IN_PLACE by the caller)."""
    if send.nbytes and recv.nbytes and np.may_share_memory(send, recv):
        raise InvalidArgument(f"{call}: sendbuf and recvbuf overlap in memory; pass "
                              "polycast.IN_PLACE as sendbuf to work in place")
