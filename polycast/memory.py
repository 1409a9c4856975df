"""Driver-side memory operations: the engine's Regions made real on numpy arrays.

The engine names memory as :class:`~polycast.engine.actions.Region` s (element ranges of a
request's ``send``/``recv``/``tmp`` buffer); a driver registers each request's arrays here
and carries out ``Send`` (:meth:`Buffers.gather`), ``Deliver`` (:meth:`Buffers.deliver`),
``Copy`` (:meth:`Buffers.copy`) and ``Complete`` (:meth:`Buffers.finalize`). The runtime and
the engine's test world share this code, so the two cannot disagree on placement or on
reduction semantics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import ops as _ops
from .collectives import Collective
from .errors import InvalidArgument
from .schedule.ir import Kind, Schedule

# A reduction reads a payload that can be read from any offset (single-copy, runtime/transport/cma.py)
# this many bytes at a time into the per-thread scratch and combines each piece at once: the
# piece is still in cache when the ufunc reads it, and the scratch stays this small whatever
# the payload. In one process (32 MiB float32 sum, process_vm_readv of its own memory into a
# reused scratch + np.add into the destination, load ~3): 256 KiB pieces 7.3 ms, 512 KiB
# 6.6, 1 MiB 6.6, 2 MiB 6.8, 4 MiB 7.2, one 32 MiB read (as before) 7.9.
REDUCE_PIECE_NBYTES = 1 << 20

# Each op combines in place with ``op.combine(a, b, out=a)`` (a ufunc for most, see
# polycast.ops); AVG sums, then divides once at the end (finalize).


def apply_avg(arr: np.ndarray, nranks: int) -> None:
    """Turn a sum into an average in place: floor division for integers (as NCCL does),
    true division for floats. The reference uses this very function, so results agree
    bit for bit."""
    if np.issubdtype(arr.dtype, np.integer):
        np.floor_divide(arr, nranks, out=arr)
    else:
        np.divide(arr, nranks, out=arr)


def buffers_used(schedule: Schedule, rank: int) -> set[str]:
    """The buffers ``rank``'s program touches."""
    used = set()
    for st in schedule.program(rank):
        if st.blocks:
            used.add(st.buf)
        if st.kind is Kind.COPY and st.dst_blocks:
            used.add(st.dst)
    return used


_SHAPES: dict[tuple[int, int], tuple] = {}


def _shape(schedule: Schedule, rank: int) -> tuple:
    """What :meth:`Buffers.register` checks a rank's arrays against: (buffers used,
    (send, recv) element counts, tmp elements or None, has an op, holds a result).
    Remembered for the few schedules a process posts again and again (working it out on
    every call was a visible share of a small call's time)."""
    key = (id(schedule), rank)
    hit = _SHAPES.get(key)
    if hit is not None and hit[0] is schedule:       # ids are reused after GC: check
        return hit[1]
    if len(_SHAPES) >= 256:
        _SHAPES.pop(next(iter(_SHAPES)))
    lays = schedule.layouts
    # .on(rank): a vector call's buffers differ per rank (polycast.schedule.ir.PerRank)
    needs = tuple(lays[n].on(rank).nelems if n in lays else 0 for n in ("send", "recv"))
    tmp = lays.get("tmp")
    tmp = None if tmp is None else tmp.on(rank)
    coll = schedule.collective
    shape = (frozenset(buffers_used(schedule, rank)), needs,
             None if tmp is None else tmp.nelems, coll.has_op,
             coll is not Collective.REDUCE or rank == schedule.root)
    _SHAPES[key] = (schedule, shape)
    return shape


@dataclass
class _Req:
    arrays: dict[str, np.ndarray]
    dtype: np.dtype
    ufunc: object
    avg: bool
    nranks: int
    result_here: bool               # this rank holds a result (AVG divides it)
    op: _ops.Op | None = None
    flat: dict[str, np.ndarray] = field(default_factory=dict)


class Buffers:
    """Per-request numpy buffers, keyed by the request id the engine uses."""

    def __init__(self) -> None:
        self._reqs: dict[int, _Req] = {}

    def register(self, req: int, schedule: Schedule, rank: int, send: np.ndarray | None,
                 recv: np.ndarray | None, op=None, tmp: np.ndarray | None = None) -> np.dtype:
        """Check the arrays against ``schedule`` (before anything is sent) and keep them.

        ``send``/``recv`` may be the same array (in place) and may be None when the rank's
        program does not touch that buffer (a non-root's send in broadcast). ``tmp`` is
        allocated from the schedule's layout, or given (a call the compiled replay began
        in its own scratch: runtime/driver/direct.py). Returns the dtype.
        """
        if req in self._reqs:
            raise InvalidArgument(f"request {req} is already registered")
        coll = schedule.collective
        used, needs, tmp_nelems, has_op, result_here = _shape(schedule, rank)
        arrays: dict[str, np.ndarray] = {}
        dtype = None
        for name, arr, need in (("send", send, needs[0]), ("recv", recv, needs[1])):
            if arr is None:
                if name in used:
                    raise InvalidArgument(f"{coll} {schedule.algorithm} on rank {rank} needs "
                                          f"a {name} buffer of {need} elements, got None")
                continue
            if not isinstance(arr, np.ndarray):
                raise InvalidArgument(f"{name} buffer must be a numpy array, got "
                                      f"{type(arr).__name__}")
            if not arr.flags.c_contiguous:
                raise InvalidArgument(f"{name} buffer must be C-contiguous")
            if arr.size != need and (name in used or arr.size < need):
                raise InvalidArgument(
                    f"{coll} count={schedule.count} on {schedule.nranks} ranks needs a "
                    f"{name} buffer of {need} elements on rank {rank}, got {arr.size}")
            if dtype is not None and arr.dtype != dtype:
                raise InvalidArgument(f"send and recv dtypes differ: {dtype} vs {arr.dtype}")
            dtype = arr.dtype
            arrays[name] = arr if arr.ndim == 1 else arr.reshape(-1)
        if dtype is None:
            dtype = np.dtype(np.uint8)
        if tmp_nelems is not None:
            if tmp is None:
                tmp = np.empty(tmp_nelems, dtype)
            elif tmp.size != tmp_nelems or tmp.dtype != dtype:
                raise InvalidArgument(f"a tmp buffer of {tmp_nelems} {dtype}, got "
                                      f"{tmp.size} {tmp.dtype}")
            arrays["tmp"] = tmp
        ropt = None
        if has_op:
            ropt = _ops.get(op if op is not None else "sum")
            try:
                ropt.check(dtype)
            except InvalidArgument:
                ropt.check(dtype, f"{coll}: ")      # again, to say which call
                raise
            if coll.ordered and ropt is _ops.AVG:
                raise InvalidArgument(f"{coll}: op avg is not defined for a scan (MPI has "
                                      "none); scan with sum and divide by rank + 1")
        elif op is not None:
            _ops.get(op)                # still reject garbage names
        self._reqs[req] = _Req(arrays, dtype, ropt.combine if ropt else None,
                               ropt is _ops.AVG, schedule.nranks, result_here, ropt)
        return dtype

    @staticmethod
    def tmp_elements(schedule: Schedule, rank: int) -> int | None:
        """The elements of the tmp buffer :meth:`register` gives ``rank``'s calls of
        ``schedule``, or None when it has none."""
        return _shape(schedule, rank)[2]

    def register_arrays(self, req: int, send: np.ndarray | None = None,
                        recv: np.ndarray | None = None) -> None:
        """Keep a point-to-point request's flat arrays (no schedule: the engine names
        element ranges of them directly)."""
        if req in self._reqs:
            raise InvalidArgument(f"request {req} is already registered")
        arrays = {n: a.reshape(-1) for n, a in (("send", send), ("recv", recv))
                  if a is not None}
        dtype = next(iter(arrays.values())).dtype if arrays else np.dtype(np.uint8)
        self._reqs[req] = _Req(arrays, dtype, None, False, 1, False)

    def unregister(self, req: int) -> None:
        self._reqs.pop(req, None)

    def __contains__(self, req: int) -> bool:
        return req in self._reqs

    def array(self, req: int, buf: str) -> np.ndarray:
        return self._reqs[req].arrays[buf]

    def arrays_of(self, req: int) -> dict[str, np.ndarray] | None:
        """A request's flat arrays by buffer name ("send", "recv", "tmp"), or None."""
        r = self._reqs.get(req)
        return None if r is None else r.arrays

    # -- the driver's memory operations --------------------------------------------------
    def view(self, region) -> list[np.ndarray]:
        """Numpy views of the region's runs (no copy)."""
        arr = self._reqs[region.req].arrays[region.buf]
        return [arr[a:b] for a, b in region.runs]

    def gather(self, region):
        """The region's bytes: a zero-copy memoryview when it is one run, else a bytes copy."""
        arr = self._reqs[region.req].arrays[region.buf]
        runs = region.runs
        if len(runs) == 1:
            a, b = runs[0]
            return memoryview(arr[a:b]).cast("B")
        if not runs:
            return b""
        return b"".join(memoryview(arr[a:b]).cast("B") for a, b in runs)

    def deliver(self, region, payload, reduce: bool) -> None:
        """Place ``payload`` (bytes-like, the runs' concatenation) into ``region``."""
        r = self._reqs[region.req]
        if region.nbytes == 0:
            return
        if payload is None:
            raise InvalidArgument(f"deliver of {region.nbytes} bytes without a payload")
        read_into = getattr(payload, "read_into", None)
        if read_into is not None:       # a payload still in its sender (runtime/transport/cma.py)
            if len(payload) != region.nbytes:
                raise InvalidArgument(f"payload of {len(payload)} bytes for a region of "
                                      f"{region.nbytes}")
            dst = r.arrays[region.buf]
            if not reduce and dst.flags.writeable:      # the one copy: into the runs
                read_into([(lo, hi - lo) for lo, hi in _addresses(dst, region.runs)])
                return
            if reduce:      # read a piece at a time into a small scratch, combine each
                # (a writer lost mid-read raises PeerLost with the pieces before it already
                # combined: the call fails and its result is undefined, as in MPI)
                isz = r.dtype.itemsize
                _reduce_pieces(dst, region.runs, r.dtype, r.ufunc,
                               payload.pieces(max(isz, REDUCE_PIECE_NBYTES // isz * isz)))
                return
            payload = payload.array()
        src = np.frombuffer(payload, dtype=r.dtype)
        if src.size != region.nelems:
            raise InvalidArgument(f"payload of {src.size} elements for a region of "
                                  f"{region.nelems}")
        arr = r.arrays[region.buf]
        if len(region.runs) == 1:
            a, b = region.runs[0]
            _into(arr, a, b, src, r.ufunc if reduce else None)
            return
        pos = 0
        for a, b in region.runs:
            n = b - a
            if reduce:
                r.ufunc(arr[a:b], src[pos:pos + n], out=arr[a:b])
            else:
                arr[a:b] = src[pos:pos + n]
            pos += n

    def copy(self, src, dst, reduce: bool) -> None:
        """Copy (or combine) ``src`` into ``dst``; a no-op when both are the same memory.
        Between two requests (a point-to-point message to this rank itself) the bytes are
        copied as they are, whatever the two dtypes."""
        r = self._reqs[src.req]
        if dst.req != src.req:
            sb = r.arrays[src.buf].view(np.uint8)
            db = self._reqs[dst.req].arrays[dst.buf].view(np.uint8)     # flat: views fine
            isz_s, isz_d = r.dtype.itemsize, self._reqs[dst.req].dtype.itemsize
            data = np.concatenate([sb[a * isz_s:b * isz_s] for a, b in src.runs]) \
                if src.runs else sb[:0]
            pos = 0
            for a, b in dst.runs:
                n = (b - a) * isz_d
                db[a * isz_d:a * isz_d + n] = data[pos:pos + n]
                pos += n
            return
        sa, da = r.arrays[src.buf], r.arrays[dst.buf]
        shared = sa is da or np.may_share_memory(sa, da)
        if not shared and len(src.runs) == 1 and len(dst.runs) == 1:
            # The common small case (a schedule's own-block copy): one slice each, distinct
            # memory; the address comparison below costs more than the copy.
            (a, b), (c, d) = src.runs[0], dst.runs[0]
            if b - a == d - c:
                _into(da, c, d, sa if not a and b == sa.size else sa[a:b],
                      r.ufunc if reduce else None)
                return
        if shared and _addresses(sa, src.runs) == _addresses(da, dst.runs):
            # In place (send is recv, or send is recv's own block as MPI_IN_PLACE allows).
            if reduce:
                raise InvalidArgument("a reducing copy of a region onto itself")
            return
        if shared:
            # Overlapping but different ranges: read everything before writing anything.
            data = np.concatenate([sa[a:b] for a, b in src.runs]) if src.runs else sa[:0]
        else:
            data = None
        views = [sa[a:b] for a, b in src.runs] if data is None else [data]
        # Walk both run lists together: their boundaries need not coincide.
        vi, vpos = 0, 0
        for a, b in dst.runs:
            while a < b:
                v = views[vi]
                take = min(b - a, v.size - vpos)
                piece = v[vpos:vpos + take]
                if reduce:
                    r.ufunc(da[a:a + take], piece, out=da[a:a + take])
                else:
                    da[a:a + take] = piece
                a += take
                vpos += take
                if vpos == v.size:
                    vi, vpos = vi + 1, 0

    def finalize(self, req: int) -> None:
        """The request completed: apply AVG's division to the result."""
        r = self._reqs.get(req)
        if r is not None and r.avg and r.result_here and "recv" in r.arrays:
            apply_avg(r.arrays["recv"], r.nranks)


def _into(dst: np.ndarray, a: int, b: int, src: np.ndarray, ufunc) -> None:
    """``src`` into ``dst[a:b]``, combined with ``ufunc`` when given. A run covering the
    whole (flat) array uses the array itself: slicing an 8-byte array cost more than
    the copy."""
    if a or b != dst.size:
        dst = dst[a:b]
    if ufunc is not None:
        ufunc(dst, src, out=dst)
    else:
        dst[...] = src


def _reduce_pieces(dst: np.ndarray, runs, dtype, ufunc, pieces) -> None:
    """Combine consecutive byte ``pieces`` (together the runs' elements, each piece a
    whole number of elements) into ``dst``'s ``runs`` in order."""
    ri, a = 0, runs[0][0]
    last = len(runs) - 1
    for piece in pieces:
        src = piece.view(dtype)
        k, n = 0, src.size
        while k < n:
            b = runs[ri][1]
            take = min(b - a, n - k)
            if take:
                _into(dst, a, a + take, src if take == n else src[k:k + take], ufunc)
                a += take
                k += take
            if a == b:
                if ri == last and k < n:
                    raise InvalidArgument("payload longer than its region")
                if ri < last:
                    ri += 1
                    a = runs[ri][0]


def _addresses(arr: np.ndarray, runs) -> list[tuple[int, int]]:
    """The byte ranges ``runs`` cover in memory, adjacent ones merged."""
    base, isz = arr.__array_interface__["data"][0], arr.itemsize
    out: list[tuple[int, int]] = []
    for a, b in runs:
        lo, hi = base + a * isz, base + b * isz
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        elif hi > lo:
            out.append((lo, hi))
    return out
