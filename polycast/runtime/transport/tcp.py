"""A framed, non-blocking TCP link to one peer.

Writes are queued and flushed with ``sendmsg`` (header and payload slices as one gather
list, no concatenation); a partial write leaves the rest queued, so the progress thread
never blocks on a full socket (two ranks sending large buffers to each other would
otherwise deadlock). Reads go into a preallocated buffer; a large payload is received with
``recv_into`` straight into an array of a per-link pool (:class:`_Pool`), given back when
the engine lets go of the payload: a fresh array per message cost a page fault per 4 KiB
(the kernel zeroes and maps every page) on top of the copy itself.

Better still, a large frame the sender marked ``lazy_ok`` (a DATA: the engine only delivers
or keeps its payload) is handed to the engine as a :class:`SocketPayload` as soon as its
header is parsed: Deliver receives it with ``recv_into`` straight into the destination as
the bytes arrive, the one copy out of the kernel, overlapping the sender's copy into it.
The link reads nothing more until that frame is finished
(:meth:`polycast.runtime.transport.lazy.LazyPayload.finish`). While such a read waits for bytes, the
link's ``pump`` (set by the driver's PeerIO) flushes every queued output, so two ranks that
read each other's frames, or a ring of them, never wait on each other; a wait with no byte
for ``stall_s`` seconds (the job's timeout, at most :data:`STALL_S`) ends the read with an
error naming the peer. Measured (bench/tcp_pair.py, 2 ranks, 16 MiB): streaming into a pool
array and then copying into the destination cost that extra copy per byte; waiting for the
whole payload to arrive before reading it (session 3) serialized the two copies.
"""

from __future__ import annotations

import collections
import ctypes
import select
import socket
import time
import weakref

import numpy as np

from .frames import PREFIX, PREFIX_NBYTES, is_driver_kind
from .lazy import LazyPayload

RX_NBYTES = 1 << 18           # staging for headers and small payloads
DIRECT_MIN_NBYTES = 1 << 15   # payloads at least this big are received into their own array
IOV_MAX = 512
# Set in a frame's header length by the sender: the payload may be read late (a DATA).
LAZY_FLAG = 0x4000_0000
STALL_S = 10.0                # a payload that sends no byte for this long: its peer is lost
WAIT_SLICE_S = 0.01           # a blocked read re-pumps our output at least this often


class SocketPayload(LazyPayload):
    """A payload whose first bytes are in the link's staging buffer (``prefix``) and the
    rest in the socket, arrived or still on its way (read as it comes)."""

    __slots__ = ("link", "prefix")

    def __init__(self, link: "TcpLink", prefix: memoryview, nbytes: int) -> None:
        super().__init__(link.peer, nbytes)
        self.link, self.prefix = link, prefix

    def _read(self, ranges) -> None:
        link = self.link
        sock = link.sock
        pre, k = self.prefix, 0
        deadline = None
        for a, n in ranges:
            view = memoryview((ctypes.c_char * n).from_address(a)).cast("B")
            pos = 0
            if k < len(pre):
                take = min(n, len(pre) - k)
                view[:take] = pre[k:k + take]
                k += take
                pos = take
            while pos < n:
                try:
                    got = sock.recv_into(view[pos:])
                except (BlockingIOError, InterruptedError):
                    # the rest is still on its way: keep our own output moving meanwhile
                    # (the sender may be waiting for it), then wait for more
                    now = time.monotonic()
                    deadline = deadline or now + link.stall_s
                    if now >= deadline:
                        raise OSError(f"no data for {link.stall_s:g} s in the middle of a "
                                      f"message") from None
                    writers = link.pump() if link.pump is not None else []
                    select.select([sock], writers, [], min(deadline - now, WAIT_SLICE_S))
                    continue
                if got == 0:
                    raise OSError(f"rank {self.src} closed its connection in the "
                                  f"middle of a message")
                pos += got
                deadline = None

    def _released(self) -> None:
        self.prefix = None
        self.link._lazy = None


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
        # Socket buffers are left to the kernel's autotuning. Fixed 4 MiB buffers (set here
        # until 2026-11-24) stalled a 16 MiB loopback allgather for 200-270 ms about once in
        # 100 calls (the zero-window persist timer: setting SO_RCVBUF turns autotuning off),
        # and measured no faster in the median.
        self._out: collections.deque = collections.deque()   # [views, token]
        self._rx = bytearray(RX_NBYTES)
        self._rxv = memoryview(self._rx)
        self._start = self._end = 0
        self._cur = None        # (hdr_len, header bytes, payload array, filled) being received
        self._pool = _Pool()
        self._lazy: SocketPayload | None = None     # handed out, not finished: read nothing
        self.lazy_frames = self.streamed_frames = 0    # large payloads: read late / streamed
        self.closed = False
        self.bye = False
        # While a SocketPayload waits for bytes: flush every queued output of the process,
        # return the sockets that still want to write (set by the driver's PeerIO).
        self.pump = None
        self.stall_s = STALL_S

    # -- writing -------------------------------------------------------------------------
    @property
    def want_write(self) -> bool:
        return bool(self._out)

    def enqueue(self, hdr_len: int, header: bytes, views: list, nbytes: int, token,
                lazy_ok: bool = False) -> None:
        """Queue one frame; ``token`` comes back from :meth:`flush` once it is all written.
        ``lazy_ok``: the receiver may hand its payload on unread (a DATA)."""
        if lazy_ok and nbytes >= DIRECT_MIN_NBYTES:
            hdr_len |= LAZY_FLAG
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
            if self._lazy is not None:
                return          # its payload is the next thing in the socket
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
            lazy = False
            if is_driver_kind(hdr_len):
                hl = 0
            else:
                lazy = bool(hdr_len & LAZY_FLAG)
                hdr_len = hl = hdr_len & ~LAZY_FLAG
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
            if lazy:
                self._lazy = SocketPayload(self, self._rxv[p0:self._end], plen)
                self.lazy_frames += 1
                out.append((hdr_len, header, self._lazy))
                self._start = self._end = 0     # the prefix view is read before reuse
                return
            if plen >= DIRECT_MIN_NBYTES or plen > len(rx) - PREFIX_NBYTES - hl:
                arr = self._pool.take(plen)
                self.streamed_frames += 1
                arr[:avail] = np.frombuffer(rx, np.uint8, avail, p0)
                self._cur = (hdr_len, header, arr, avail)
                self._start = self._end = 0
                return
            if self._start > 0:
                self._compact()
            return
        if self._start == self._end:
            self._start = self._end = 0
