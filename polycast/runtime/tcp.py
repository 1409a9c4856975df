"""A framed, non-blocking TCP link to one peer.

Writes are queued and flushed with ``sendmsg`` (header and payload slices as one gather
list, no concatenation); a partial write leaves the rest queued, so the progress thread
never blocks on a full socket (two ranks sending large buffers to each other would
otherwise deadlock). Reads go into a preallocated buffer; a large payload is received with
``recv_into`` straight into an array of a per-link pool (:class:`_Pool`), given back when
the engine lets go of the payload: a fresh array per message cost a page fault per 4 KiB
(the kernel zeroes and maps every page) on top of the copy itself.
"""

from __future__ import annotations

import collections
import socket
import weakref

import numpy as np

from .frames import PREFIX, PREFIX_NBYTES, is_driver_kind

RX_NBYTES = 1 << 18           # staging for headers and small payloads
DIRECT_MIN_NBYTES = 1 << 15   # payloads at least this big are received into their own array
IOV_MAX = 512
SOCK_BUF_NBYTES = 4 << 20


class _Pool:
    """Receive arrays by power-of-two size class, reused once their payload is freed (a
    weakref finalizer on the handed-out view); at most ``keep`` idle per class."""

    def __init__(self, keep: int = 4) -> None:
        self._free: dict[int, list] = {}
        self._keep = keep

    def take(self, nbytes: int) -> np.ndarray:
        cls = max(DIRECT_MIN_NBYTES, 1 << (nbytes - 1).bit_length())
        free = self._free.get(cls)
        base = free.pop() if free else np.empty(cls, np.uint8)
        view = base[:nbytes]
        weakref.finalize(view, self._give_back, cls, base)
        return view

    def _give_back(self, cls: int, base: np.ndarray) -> None:
        free = self._free.setdefault(cls, [])
        if len(free) < self._keep:
            free.append(base)


class LinkClosed(Exception):
    """The peer closed the connection (orderly ``bye`` or not)."""

    def __init__(self, reason: str, orderly: bool = False) -> None:
        super().__init__(reason)
        self.orderly = orderly


class TcpLink:
    def __init__(self, sock: socket.socket, peer: int) -> None:
        self.sock, self.peer = sock, peer
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, SOCK_BUF_NBYTES)
            except OSError:
                pass
        self._out: collections.deque = collections.deque()   # [views, token]
        self._rx = bytearray(RX_NBYTES)
        self._rxv = memoryview(self._rx)
        self._start = self._end = 0
        self._cur = None        # (hdr_len, header bytes, payload array, filled) being received
        self._pool = _Pool()
        self.closed = False
        self.bye = False

    # -- writing -------------------------------------------------------------------------
    @property
    def want_write(self) -> bool:
        return bool(self._out)

    def enqueue(self, hdr_len: int, header: bytes, views: list, nbytes: int, token) -> None:
        """Queue one frame; ``token`` comes back from :meth:`flush` once it is all written."""
        bufs = [PREFIX.pack(hdr_len, nbytes)]
        if header:
            bufs.append(header)
        bufs.extend(v for v in views if len(v))
        self._out.append([collections.deque(memoryview(b).cast("B") for b in bufs), token])

    def discard_queued(self) -> list:
        """Forget every frame not yet written (the peer is gone); return their tokens."""
        tokens = [token for _, token in self._out if token is not None]
        self._out.clear()
        return tokens

    def flush(self) -> list:
        """Write as much as the socket takes now; return the tokens of frames fully sent."""
        done = []
        while self._out:
            entry = self._out[0]
            bufs = entry[0]
            iov = []
            for b in bufs:
                iov.append(b)
                if len(iov) >= IOV_MAX:
                    break
            # Gather the following frames too, so small messages leave in one syscall.
            if len(iov) < IOV_MAX:
                for other in list(self._out)[1:16]:
                    iov.extend(other[0])
                    if len(iov) >= IOV_MAX:
                        break
                iov = iov[:IOV_MAX]
            try:
                sent = self.sock.sendmsg(iov)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                raise LinkClosed(f"send to rank {self.peer} failed: {exc}") from None
            while sent and self._out:
                entry = self._out[0]
                bufs = entry[0]
                while bufs and sent:
                    b = bufs[0]
                    if sent >= len(b):
                        sent -= len(b)
                        bufs.popleft()
                    else:
                        bufs[0] = b[sent:]
                        sent = 0
                if not bufs:
                    self._out.popleft()
                    if entry[1] is not None:
                        done.append(entry[1])
                else:
                    break
        return done

    # -- reading -------------------------------------------------------------------------
    def read(self, out: list, max_rounds: int = 16) -> None:
        """Receive what is available; append ``(hdr_len, header, payload)`` per whole frame
        to ``out`` (payload: a memoryview, or None). Raises :class:`LinkClosed` on EOF."""
        for _ in range(max_rounds):
            try:
                if self._cur is not None:
                    hdr_len, header, arr, filled = self._cur
                    n = self.sock.recv_into(memoryview(arr)[filled:])
                    if n == 0:
                        self._eof()
                    filled += n
                    if filled == len(arr):
                        self._cur = None
                        out.append((hdr_len, header, memoryview(arr)))
                    else:
                        self._cur = (hdr_len, header, arr, filled)
                        return
                    continue
                if self._end == len(self._rx):
                    self._compact()
                n = self.sock.recv_into(self._rxv[self._end:])
                if n == 0:
                    self._eof()
                self._end += n
                self._parse(out)
            except (BlockingIOError, InterruptedError):
                return
            except (ConnectionError, OSError) as exc:
                if isinstance(exc, LinkClosed):
                    raise
                raise LinkClosed(f"connection to rank {self.peer} broke: {exc}") from None

    def _eof(self):
        self.closed = True
        raise LinkClosed(f"rank {self.peer} closed its connection", orderly=self.bye)

    def _compact(self) -> None:
        n = self._end - self._start
        self._rx[:n] = self._rx[self._start:self._end]
        self._start, self._end = 0, n

    def _parse(self, out: list) -> None:
        rx = self._rx
        while self._end - self._start >= PREFIX_NBYTES:
            hdr_len, plen = PREFIX.unpack_from(rx, self._start)
            hl = 0 if is_driver_kind(hdr_len) else hdr_len
            have = self._end - self._start - PREFIX_NBYTES
            if have < hl:
                if self._start > 0:
                    self._compact()
                return
            h0 = self._start + PREFIX_NBYTES
            header = bytes(rx[h0:h0 + hl])
            p0 = h0 + hl
            avail = self._end - p0
            if plen <= avail:
                payload = memoryview(bytes(rx[p0:p0 + plen])) if plen else None
                out.append((hdr_len, header, payload))
                self._start = p0 + plen
                continue
            if plen >= DIRECT_MIN_NBYTES or plen > len(rx) - PREFIX_NBYTES - hl:
                arr = self._pool.take(plen)
                arr[:avail] = np.frombuffer(rx, np.uint8, avail, p0)
                self._cur = (hdr_len, header, arr, avail)
                self._start = self._end = 0
                return
            if self._start > 0:
                self._compact()
            return
        if self._start == self._end:
            self._start = self._end = 0
