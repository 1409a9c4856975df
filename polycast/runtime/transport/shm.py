"""Single-producer single-consumer byte rings in shared memory, one per ordered pair of
ranks on a host.

A ring is a file in /dev/shm mapped by both processes (created by the reader, unlinked as
soon as the writer has mapped it, so a crash leaks nothing). Frames are the same as on TCP
(:mod:`polycast.runtime.transport.frames`), padded to 16 bytes. The writer copies the payload
straight from the user's array into the ring; the reader hands the engine a view *into the
ring*, which Deliver copies or reduces straight into the destination array: one copy on
each side, no kernel. A frame stays pinned until its payload has been delivered (or dropped) by
the engine. Frames are never copied out to free the ring (except payloads of at most
COPY_OUT_NBYTES, whose copy is cheaper than the pin): a pinned frame holds the ring's
tail, and every frame behind it, until delivered anyway, and copying measured 25% of a
rank's CPU in a 16 MiB ring allreduce. So a writer may stall behind a pinned frame (the wait
is the peer's own progress; two ranks each stalled behind the other's undelivered message
would need both rings full of early messages, which the driver makes unlikely by cutting
messages to about 1 MiB). A message
bigger than a quarter of the ring travels in pieces and is reassembled.

Wake-ups: the reader raises ``reader_sleeping`` before it blocks, saying how it sleeps: in
``select`` (a writer that sees it sends a one-frame doorbell over the peer's TCP
connection) or on the ring's futex counter (the writer, which bumps that counter after
every flush, makes one ``FUTEX_WAKE``: :mod:`polycast.runtime.transport.futex`). A writer blocked on
a full ring is woken the same two ways by the reader freeing space. The driver bounds
every wait so a wake-up lost to a memory-ordering race costs milliseconds, never a hang.

Two implementations of the per-frame work share this layout: the compiled helper
(:mod:`polycast.runtime.transport.native`, ``_ring.c``: release/acquire atomics on HEAD/TAIL, a full fence
in the two flag-then-check handshakes, small frames parsed in C) and this module's Python, the
fallback (the ``native=0`` test hook, or no compiler at install). A writer of one kind and a reader of
the other interoperate; pieces of large messages and pinned payload views stay in Python.
"""

from __future__ import annotations

import collections
import mmap
import os
import platform
import weakref

import numpy as np

from . import layout as L
from . import native as _native
from .frames import (KIND_BASE, KIND_FRAG_FIRST, KIND_FRAG_MORE, PREFIX, PREFIX_NBYTES)

# The layout (ring_layout.h, the one definition the compiled rings read too): the control
# block's u64 slots, by byte offset.
KIND_WRAP = L.KIND_WRAP
CTRL_NBYTES = L.CTRL_NBYTES
HEAD, TAIL = L.SLOT_HEAD, L.SLOT_TAIL
READER_SLEEPING, WRITER_BLOCKED = L.SLOT_READER_SLEEPING, L.SLOT_WRITER_BLOCKED
# Futex counters (their low 32 bits; :mod:`polycast.runtime.transport.futex`): the writer bumps
# DATA_BELL after each flush that wrote, the reader SPACE_BELL whenever it frees space.
DATA_BELL, SPACE_BELL = L.SLOT_DATA_BELL, L.SLOT_SPACE_BELL
# The reader's verdict on single-copy reads from the writer (runtime/transport/cma.py), written
# once at connect time before any frame: CMA_UNKNOWN, CMA_YES or CMA_NO.
CMA_VERDICT = L.SLOT_CMA_VERDICT
CMA_UNKNOWN, CMA_YES, CMA_NO = L.CMA_UNKNOWN, L.CMA_YES, L.CMA_NO
_U32 = 0xFFFFFFFF
SLEEP_SELECT, SLEEP_FUTEX = L.SLEEP_SELECT, L.SLEEP_FUTEX   # how a sleeping reader waits
ALIGN = L.ALIGN
# Payloads up to this size are copied out of the ring at once (a 8-byte allreduce's
# messages): cheaper than pinning the frame behind a view with a weakref finalizer.
COPY_OUT_NBYTES = 4096
SHM_DIR = "/dev/shm"


def _pad(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def ring_path(job_id: str, src: int, dst: int) -> str:
    return os.path.join(SHM_DIR, f"polycast-{job_id}-{src}-{dst}")


# The Python rings (and the symm and offload paths' shared memory) publish data by storing a
# counter after the payload, with no fence between: correct where the CPU keeps stores in
# order (x86-64's total store order). On weaker memory models (arm64, POWER) a reader could
# see the counter before the data, so they are not offered there. The compiled rings order
# their accesses (release/acquire, runtime/transport/_ring.c) and run on any CPU: rings_unavailable_reason.
_TSO_MACHINES = ("x86_64", "amd64", "i386", "i686", "x86")


def shm_unavailable_reason() -> str | None:
    """Why shared memory accessed from Python (the Python rings, symm, offload) cannot be
    used here, or None when it can."""
    machine = platform.machine().lower()
    if machine not in _TSO_MACHINES:
        return (f"the shm rings rely on x86-64 store ordering and this CPU is {machine!r}; "
                "use POLYCAST_TRANSPORT=tcp")
    if not (os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)):
        return f"{SHM_DIR} is not a writable directory"
    return None


def shm_available() -> bool:
    return shm_unavailable_reason() is None


def rings_unavailable_reason(native: bool | None = None) -> str | None:
    """Why this process cannot run the shm rings between ranks, or None when it can: the
    compiled rings need only a writable /dev/shm; the Python ones x86-64's store order too.
    ``native``: whether the compiled rings are to be used (default: when loaded)."""
    if native is None:
        native = _native.ring is not None
    if not native:
        return shm_unavailable_reason()
    if not (os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)):
        return f"{SHM_DIR} is not a writable directory"
    return None


class Ring:
    """One mapped ring; ``create`` for the reader side, ``attach`` for the writer side."""

    def __init__(self, path: str, capacity: int, create: bool,
                 native: bool | None = None) -> None:
        """``native``: use the compiled hot path (default: when runtime/transport/native.py loaded it)."""
        if capacity & (capacity - 1) or capacity < 1 << 16:
            raise ValueError(f"ring capacity must be a power of two >= 64 KiB, got {capacity}")
        self.path, self.capacity = path, capacity
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, CTRL_NBYTES + capacity)
            # Populate the page tables now: page faults cost ~1 us per 4 KiB page here,
            # which would otherwise land on the first collectives.
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self._mm = mmap.mmap(fd, CTRL_NBYTES + capacity, flags=flags)
        finally:
            os.close(fd)
        self.ctrl = np.ndarray((CTRL_NBYTES // 8,), np.uint64, self._mm, 0)
        # The shared counters through a memoryview: an item read is a plain aligned 8-byte
        # load returning an int, ~5x cheaper than numpy scalar indexing (spinning readers
        # look at HEAD in a loop).
        self._ctl = memoryview(self._mm)[:CTRL_NBYTES].cast("Q")
        self.data = np.ndarray((capacity,), np.uint8, self._mm, CTRL_NBYTES)
        self._buf = memoryview(self._mm)[CTRL_NBYTES:]
        # The compiled hot path over the same mapping; its acquire loads and release stores
        # of the counters replace the plain ones below (instance attributes shadow them).
        self._nat = None
        if native is None:
            native = _native.ring is not None
        if native:
            if _native.ring is None:
                raise RuntimeError(f"the compiled ring helper is not in use: {_native.why_not}")
            self._nat = _native.ring.RingMap(self._mm, capacity)
            self._get, self._set = self._nat.load, self._nat.store
        base = self.ctrl.__array_interface__["data"][0]
        self.data_bell_addr = base + DATA_BELL      # where a sleeping reader waits
        self.space_bell_addr = base + SPACE_BELL    # where a writer blocked on space waits
        # reader state
        self._handed: collections.deque = collections.deque()   # [end, released]
        self.pinned_nbytes = 0
        self._frag = None        # (hdr_len, header, array, filled)
        self._read_pos = 0
        self.want_bell = False     # a writer blocked on us needs a doorbell
        # writer state
        self._out: collections.deque = collections.deque()
        self.space_seen: int | None = None  # space counter when a frame last did not fit

    @classmethod
    def create(cls, path: str, capacity: int, native: bool | None = None) -> "Ring":
        return cls(path, capacity, True, native)

    @classmethod
    def attach(cls, path: str, capacity: int, native: bool | None = None) -> "Ring":
        return cls(path, capacity, False, native)

    @property
    def native(self) -> bool:
        """Whether this ring runs the compiled hot path."""
        return self._nat is not None

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self.ctrl = self.data = None
        if self._nat is not None:
            self._nat.release()
        self._ctl.release()
        self._buf.release()
        try:
            self._mm.close()
        except BufferError:
            pass    # a payload view is still alive somewhere; the mapping goes with it

    def set_cma_verdict(self, ok: bool) -> None:
        """(reader) Whether this ring's writer may send single-copy descriptors."""
        self._set(CMA_VERDICT, CMA_YES if ok else CMA_NO)

    @property
    def cma_ok(self) -> bool:
        """(writer) The reader can read our memory: large payloads may go single-copy."""
        return self._get(CMA_VERDICT) == CMA_YES

    # -- shared counters (aligned 8-byte loads and stores are atomic on x86-64/arm64) --
    def _get(self, slot: int) -> int:
        return self._ctl[slot >> 3]

    def _set(self, slot: int, value: int) -> None:
        self._ctl[slot >> 3] = value

    @property
    def max_piece(self) -> int:
        return self.capacity // 4

    # -- writer ---------------------------------------------------------------------------
    @property
    def want_write(self) -> bool:
        return bool(self._out)

    def enqueue(self, hdr_len: int, header: bytes, views: list, nbytes: int, token) -> None:
        # The compiled writer takes any contiguous buffers; the Python one byte views.
        parts = list(views) if self._nat is not None else \
            [memoryview(v).cast("B") for v in views if len(v)]
        self._out.append([hdr_len, header, parts, nbytes, token, 0])

    def discard_queued(self) -> list:
        """Forget every frame not yet (fully) written (the reader is gone); their tokens."""
        tokens = [entry[4] for entry in self._out if entry[4] is not None]
        self._out.clear()
        self.space_seen = None
        return tokens

    def flush(self) -> tuple[list, bool]:
        """Copy queued frames into the ring while they fit. Returns (tokens of messages
        fully written, how the reader wants to be woken: 0 not at all, SLEEP_SELECT a
        doorbell frame, SLEEP_FUTEX a futex wake on ``data_bell_addr``)."""
        done, wrote = [], False
        while self._out:
            entry = self._out[0]
            if not self._write_piece(entry):
                # The space counter as it was before the re-check below: a writer that
                # sleeps waits for it to change, so space freed between the re-check and
                # the sleep (whose FUTEX_WAKE came too early) still ends the wait at once.
                self.space_seen = self._get(SPACE_BELL)
                self._flag(WRITER_BLOCKED, 1)
                # Re-check: the reader may have freed space before it saw the flag.
                if not self._write_piece(entry):
                    break
                self._set(WRITER_BLOCKED, 0)
            self.space_seen = None
            wrote = True
            if entry[5] >= entry[3]:
                self._out.popleft()
                if entry[4] is not None:
                    done.append(entry[4])
        if not wrote:
            return done, False
        return done, self._bell()

    def write_now(self, hdr_len: int, header: bytes, views: list, nbytes: int):
        """Write one whole frame now, when nothing is queued before it and the ring has
        the space: returns how the reader wants to be woken (as :meth:`flush`); None when
        it was not written (then :meth:`enqueue` it). A frame written here is complete:
        its payload is in the ring, its source may be reused."""
        if self._out or nbytes + len(header) + PREFIX_NBYTES > self.max_piece:
            return None
        if self._nat is not None:
            if not self._nat.write(hdr_len, header, views, nbytes):
                return None
        elif not self._write_piece([hdr_len, header,
                                    [memoryview(v).cast("B") for v in views if len(v)],
                                    nbytes, None, 0]):
            return None
        return self._bell()

    def _bell(self):
        """(writer, after frames were written) bump the data counter; how the reader
        sleeps (0: awake)."""
        if self._nat is not None:
            return self._nat.ring_bell()
        ctl = self._ctl
        ctl[DATA_BELL >> 3] = (ctl[DATA_BELL >> 3] + 1) & _U32     # after HEAD: TSO
        return ctl[READER_SLEEPING >> 3]

    def _reserve(self, frame_nbytes: int) -> int | None:
        """Position for a frame of ``frame_nbytes`` (padded), writing a wrap marker if it
        does not fit before the end; None if the ring lacks space."""
        cap = self.capacity
        head, tail = self._get(HEAD), self._get(TAIL)
        pos = head % cap
        skip = cap - pos if pos + frame_nbytes > cap else 0
        if cap - (head - tail) < skip + frame_nbytes:
            return None
        if skip:
            PREFIX.pack_into(self._buf, pos, KIND_WRAP, 0)
            head += skip
            self._set(HEAD, head)
        return head

    def _flag(self, slot: int, value: int) -> None:
        """Store a flag the peer checks after publishing; our next load must not pass it."""
        if self._nat is not None:
            self._nat.flag(slot, value)
        else:
            self._set(slot, value)     # x86-64 may still pass it: the bounded waits cover it

    def _write_piece(self, entry) -> bool:
        hdr_len, header, views, nbytes, _token, sent = entry
        data = self.data
        cap = self.capacity
        whole = sent == 0 and nbytes + len(header) + PREFIX_NBYTES <= self.max_piece
        if whole and self._nat is not None:
            if not self._nat.write(hdr_len, header, views, nbytes):
                return False
            entry[5] = max(nbytes, 1)
            return True
        if self._nat is not None:
            views = [memoryview(v).cast("B") for v in views if len(v)]
        if whole:
            total = _pad(PREFIX_NBYTES + len(header) + nbytes)
            head = self._reserve(total)
            if head is None:
                return False
            pos = head % cap
            PREFIX.pack_into(self._buf, pos, hdr_len, nbytes)
            p = pos + PREFIX_NBYTES
            if header:
                self._buf[p:p + len(header)] = header
                p += len(header)
            buf = self._buf
            for v in views:
                n = len(v)
                if n <= COPY_OUT_NBYTES:
                    buf[p:p + n] = v        # memoryview copy: ~3x cheaper than numpy's here
                else:
                    data[p:p + n] = np.frombuffer(v, np.uint8)
                p += n
            entry[5] = max(nbytes, 1)
            self._set(HEAD, head + total)
            return True
        # Pieces: FIRST carries the inner prefix and the header, then payload slices.
        first = sent == 0
        extra = PREFIX_NBYTES + len(header) if first else 0
        piece = min(nbytes - sent, self.max_piece - PREFIX_NBYTES - extra)
        total = _pad(PREFIX_NBYTES + extra + piece)
        head = self._reserve(total)
        if head is None:
            return False
        pos = head % cap
        PREFIX.pack_into(self._buf, pos, KIND_FRAG_FIRST if first else KIND_FRAG_MORE, piece)
        p = pos + PREFIX_NBYTES
        if first:
            PREFIX.pack_into(self._buf, p, hdr_len, nbytes)
            p += PREFIX_NBYTES
            if header:
                self._buf[p:p + len(header)] = header
                p += len(header)
        # Copy payload bytes [sent, sent+piece) out of the gather list.
        skip, left = sent, piece
        for v in views:
            n = len(v)
            if skip >= n:
                skip -= n
                continue
            take = min(n - skip, left)
            data[p:p + take] = np.frombuffer(v, np.uint8, take, skip)
            p += take
            left -= take
            skip = 0
            if not left:
                break
        entry[5] = sent + piece
        self._set(HEAD, head + total)
        return True

    # -- reader ---------------------------------------------------------------------------
    def poll(self, out: list, max_frames: int = 64) -> bool:
        """Append ``(hdr_len, header, payload, key)`` per whole message to ``out``; ``key``
        is not None when ``payload`` is a view into the ring that must be given back with
        :meth:`release`. Returns whether the writer is blocked and wants a doorbell."""
        if self._nat is not None:
            return self._poll_native(out, max_frames)
        head = self._get(HEAD)
        pos = self._read_pos
        n = 0
        while pos < head and n < max_frames:
            pos, k = self._take(pos, out)
            n += k
        self._read_pos = pos
        return self._advance()

    def _poll_native(self, out: list, max_frames: int) -> bool:
        # C takes the run of small frames (copied out, given back at once: one tail entry
        # covers them all); a frame it stops at (pieces, a large payload) is taken here.
        n = 0
        nat = self._nat
        while True:
            pos0 = self._read_pos
            pos, k, head = nat.poll(pos0, max_frames - n, out, COPY_OUT_NBYTES)
            n += k
            if pos != pos0:
                self._handed.append([pos, True])
            if pos >= head or n >= max_frames:
                self._read_pos = pos
                break
            self._read_pos, k = self._take(pos, out)
            n += k
        return self._advance()

    def _take(self, pos: int, out: list) -> tuple[int, int]:
        """Take the frame at ``pos``: (position after it, whole messages appended to out)."""
        cap = self.capacity
        at = pos % cap
        hdr_len, plen = PREFIX.unpack_from(self._buf, at)
        if hdr_len == KIND_WRAP:
            pos += cap - at
            self._handed.append([pos, True])
            return pos, 0
        if hdr_len in (KIND_FRAG_FIRST, KIND_FRAG_MORE):
            p = at + PREFIX_NBYTES
            if hdr_len == KIND_FRAG_FIRST:
                real, total = PREFIX.unpack_from(self._buf, p)
                p += PREFIX_NBYTES
                header = bytes(self._buf[p:p + real])
                p += real
                self._frag = (real, header, np.empty(total, np.uint8), 0)
                size = _pad(2 * PREFIX_NBYTES + real + plen)
            else:
                size = _pad(PREFIX_NBYTES + plen)
            real, header, arr, filled = self._frag
            arr[filled:filled + plen] = self.data[p:p + plen]
            filled += plen
            pos += size
            self._handed.append([pos, True])
            if filled == len(arr):
                self._frag = None
                out.append((real, header, memoryview(arr), None))
                return pos, 1
            self._frag = (real, header, arr, filled)
            return pos, 0
        hl = 0 if hdr_len >= KIND_BASE else hdr_len
        p = at + PREFIX_NBYTES
        header = bytes(self._buf[p:p + hl]) if hl else b""
        p += hl
        size = _pad(PREFIX_NBYTES + hl + plen)
        pos += size
        if plen == 0:
            out.append((hdr_len, header, None, None))
            self._handed.append([pos, True])
        elif plen <= COPY_OUT_NBYTES:
            # Small: a copy costs less than the view's finalizer and frees the frame now.
            out.append((hdr_len, header, memoryview(bytes(self._buf[p:p + plen])), None))
            self._handed.append([pos, True])
        else:
            key = [pos, False, size]
            self._handed.append(key)
            self.pinned_nbytes += size
            view = self.data[p:p + plen]
            # The frame goes back to the writer when the engine lets go of the view
            # (delivered or dropped): the view's finalizer releases it.
            weakref.finalize(view, self._on_view_freed, key)
            out.append((hdr_len, header, view, key))
        return pos, 1

    def _on_view_freed(self, key) -> None:
        # Runs wherever the last reference dies (the progress thread); never raises.
        try:
            if self.ctrl is not None and self.release(key):
                self.want_bell = True
        except Exception:
            pass

    want_bell = False

    def release(self, key) -> bool:
        """Give back a payload view; returns whether the writer wants a doorbell."""
        if not key[1]:
            key[1] = True
            self.pinned_nbytes -= key[2]
        return self._advance()

    def _advance(self) -> bool:
        new_tail = None
        while self._handed and self._handed[0][1]:
            new_tail = self._handed.popleft()[0]
        if new_tail is not None and self._nat is not None:
            return self._nat.advance(new_tail)
        if new_tail is not None:
            self._set(TAIL, new_tail)
            ctl = self._ctl
            ctl[SPACE_BELL >> 3] = (ctl[SPACE_BELL >> 3] + 1) & _U32
            if self._get(WRITER_BLOCKED):
                self._set(WRITER_BLOCKED, 0)
                return True
        return False

    def set_sleeping(self, sleeping) -> None:
        """The reader sleeps (True or SLEEP_SELECT: wake it with a doorbell frame;
        SLEEP_FUTEX: with a futex wake) or is awake (False, 0)."""
        self._flag(READER_SLEEPING, int(sleeping))

    def space_wait_value(self) -> int:
        """The space counter value a sleeping writer waits to change: the one seen when
        it found the ring full, if it is blocked (else the current one)."""
        seen = self.space_seen
        return self._get(SPACE_BELL) if seen is None else seen

    def data_bell(self) -> int:
        return self._get(DATA_BELL)

    def space_bell(self) -> int:
        return self._get(SPACE_BELL)

    def pending_input(self) -> bool:
        return self._get(HEAD) > self._read_pos
