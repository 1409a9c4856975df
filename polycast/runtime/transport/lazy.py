"""Payloads the transport has not copied yet: the engine's Deliver reads them straight into
their destination.

A reliable transport may hand the engine, as the payload of a DATA or P2P_DATA frame (whose
payload the engine only delivers or keeps, SEAMS2.md), a :class:`LazyPayload` instead of
bytes: shared memory's single-copy descriptors (:class:`polycast.runtime.transport.cma.RemotePayload`,
the bytes are in the sender's memory) and TCP frames whose payload still waits in the
socket (:class:`polycast.runtime.transport.tcp.SocketPayload`). ``Buffers.deliver`` calls
:meth:`LazyPayload.read_into` with the destination's address ranges (the one copy);
``engine.early.own`` calls :meth:`LazyPayload.own` for memory of its own. The transport
calls :meth:`LazyPayload.finish` once the frame has been handled: what nobody read is read
then, so nothing the engine keeps depends on the sender's memory or the socket any more.
Each payload is read from its source at most once.

A payload whose source stays readable past its frame (the sender keeps its memory until
told, :class:`~polycast.runtime.transport.cma.RemotePayload`) may be held unread: the engine's
``hold()`` on a pulled DATA (engine/early.py). The transport then does not finish it when the
frame has been handled; it hears (``on_done``) when the payload is read, or let go unread
(:meth:`LazyPayload.release`), and only then lets the sender reuse its memory.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from ...errors import PeerLost

_scratch = threading.local()


def scratch(nbytes: int) -> np.ndarray:
    """A per-thread byte array of at least ``nbytes`` (a reduction reads into it, then
    combines at once): reused, so large reads do not fault in fresh pages every time."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.nbytes < nbytes:
        buf = _scratch.buf = np.empty(max(nbytes, 1 << 20), np.uint8)
    return buf[:nbytes]


class LazyPayload:
    """``nbytes`` bytes from rank ``src`` that are read on demand; subclasses provide
    ``_read(ranges)`` (raises OSError) and ``_why(exc)``."""

    __slots__ = ("src", "nbytes", "used", "local", "closed", "error", "holding", "on_done")
    # True when ``_read_at`` reads from any offset (then :meth:`pieces` reads piecewise).
    piecewise = False
    # True when the source stays readable past the frame until released (:meth:`hold`).
    holdable = False

    def __init__(self, src: int, nbytes: int) -> None:
        self.src, self.nbytes = src, nbytes
        self.used = False           # read from the source (into a destination, or kept)
        self.local = None           # bytes of our own, once read for keeping
        self.closed = False         # finished: the source is no longer ours to read
        self.error: str | None = None
        self.holding = False        # kept unread past its frame (hold)
        self.on_done = None         # fn() the transport sets on a held payload

    def hold(self) -> bool:
        """Keep the payload unread past its frame; False when the source cannot wait (not
        ``holdable``) or it was read or finished already."""
        if not self.holdable or self.closed or self.used or self.error is not None:
            return False
        self.holding = True
        return True

    def release(self) -> None:
        """A held payload will not be read: its source may go on."""
        if self.holding:
            self.closed = True
            self._let_go()

    def _let_go(self) -> None:
        self.holding = False
        done, self.on_done = self.on_done, None
        if done is not None:
            done()

    def __len__(self) -> int:
        return self.nbytes

    def _read(self, ranges) -> None:
        raise NotImplementedError

    def _read_at(self, offset: int, ranges) -> None:
        """Read the payload's bytes from ``offset`` on into ``ranges`` (``piecewise`` only)."""
        raise NotImplementedError

    def _why(self, exc: OSError) -> str:
        return f"reading its {self.nbytes} bytes message failed: {exc}"

    def _take(self) -> None:
        """Mark the source read (once only)."""
        if self.closed or self.used or self.error is not None:
            raise PeerLost(self.src, self.error or "a lazy payload was read twice or after "
                                                   "it was released (driver bug)")
        self.used = True

    def _lost(self, exc: OSError) -> PeerLost:
        self.error = self._why(exc)
        return PeerLost(self.src, self.error)

    def read_into(self, ranges) -> None:
        """Copy the payload into local (address, nbytes) ranges (their total = nbytes)."""
        if self.local is not None:
            src = np.frombuffer(self.local, np.uint8)
            pos = 0
            for a, n in ranges:
                ctypes.memmove(a, src[pos:pos + n].ctypes.data, n)
                pos += n
            return
        self._take()
        try:
            self._read(ranges)
        except OSError as exc:
            raise self._lost(exc) from None
        if self.holding:
            self._let_go()

    def pieces(self, nbytes_max: int):
        """The payload in order, as byte arrays of at most ``nbytes_max`` bytes each (the
        per-thread scratch: use each before asking for the next). One piece (the whole
        payload) unless it can be read piecewise and is larger than ``nbytes_max``."""
        if self.local is not None or not self.piecewise or self.nbytes <= nbytes_max:
            yield self.array()
            return
        self._take()
        buf = scratch(nbytes_max)
        addr = buf.ctypes.data
        for off in range(0, self.nbytes, nbytes_max):
            n = min(nbytes_max, self.nbytes - off)
            try:
                self._read_at(off, [(addr, n)])
            except OSError as exc:
                raise self._lost(exc) from None
            if self.holding and off + n == self.nbytes:
                self._let_go()              # all read: the source may go on
            yield buf[:n]

    def array(self) -> np.ndarray:
        """The payload as a byte array (a per-thread scratch: use it before the next)."""
        if self.local is not None:
            return np.frombuffer(self.local, np.uint8)
        buf = scratch(self.nbytes)
        self.read_into([(buf.ctypes.data, self.nbytes)])
        return buf

    def own(self):
        """The payload as memory of our own (the engine keeps it for later)."""
        if self.local is None:
            buf = np.empty(self.nbytes, np.uint8)
            self.read_into([(buf.ctypes.data, self.nbytes)])
            self.local = memoryview(buf)
        return self.local

    def __bytes__(self) -> bytes:
        return bytes(self.own())

    def finish(self) -> None:
        """The frame was handled: read what nobody read (it is kept for later, or was
        dropped), then release the source. Raises PeerLost when it cannot be read."""
        try:
            if not self.used and self.error is None:
                self.own()
        finally:
            self.closed = True
            self._released()
        if self.error is not None:
            raise PeerLost(self.src, self.error)

    def _released(self) -> None:
        """The source may go on (the socket's next frame may be read)."""
