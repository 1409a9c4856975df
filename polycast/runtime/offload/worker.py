"""A multicast receive worker of the offload process (``python -m
polycast.runtime.offload.worker``; started, fed and ended by :mod:`.streams`).

It joins the groups of the roots it owns, and for each datagram: verifies it (wire format,
MAC with the job's key, call signature), and places its chunk into the arena buffer of
every local rank whose engine opened that stream, then reports the placed chunk ranges, in
batches, to the offload process, which hands them to the engines. The compiled helper
(runtime/transport/_dgram.c, ``cfg["dgram"]``) does the reading (recvmmsg, GRO), the
checks, the bounds, the bitmap, the duplicates and the copies, and hands this module only
what it cannot place; without it :class:`polycast.engine.stream.Stream` does them here, one
datagram at a time. Datagrams of streams no
local rank has opened yet are held (bounded: ``HOLD_NBYTES``, oldest dropped first, the
protocol recovers them) until every local receiver has opened the stream. Recovered bytes
come from the offload process (DATA) and are placed and reported the same way. After a
CLOSE it writes nothing more into that stream's buffer, and acknowledges.

It exits on STOP, or when the offload process goes away (its socket closes).
"""

from __future__ import annotations

import array
import collections
import json
import mmap
import os
import select
import signal
import socket
import sys
import time

from ...engine.stream import Stream
from ...engine.wire import MsgKind, WireError, parse_datagram
from ..transport import dgram
from ..transport import faults as _faults
from ..transport.shm import Ring
from . import descriptors as D
from .channel import Channel

HOLD_NBYTES = 64 << 20          # datagrams held for streams not opened yet
READ_BATCH = 64                 # datagrams per socket per round
IDLE_SECONDS = 0.05
CLOSED_KEPT = 4096              # closed stream keys remembered (their stragglers dropped)
_DATA, _EOS = MsgKind.MCAST_DATA, MsgKind.MCAST_EOS


class _Dest:
    """One local rank's copy of a stream: where it goes and what was placed."""

    __slots__ = ("rank", "stream", "base", "sig", "mv", "pending", "placed", "eos",
                 "recovered")

    def __init__(self, rank, stream, base, sig, mv) -> None:
        self.rank, self.stream, self.base, self.sig, self.mv = rank, stream, base, sig, mv
        self.pending: list[int] = []        # chunk indices placed, not reported yet
        self.placed: list = []              # (c0, c1) the helper placed, not reported yet
        self.eos = False                    # EOS seen, not reported yet
        self.recovered: list = []           # (c0, c1) placed from DATA, not reported yet


class _Entry:
    __slots__ = ("dests", "held", "expected", "opened")

    def __init__(self) -> None:
        self.dests: dict[int, _Dest] = {}
        self.held: list = []                # (header, payload bytes) for later openers
        self.expected: int | None = None    # local receivers (known at the first OPEN)
        self.opened = 0


class Worker:
    def __init__(self, cfg: dict, channel: Channel) -> None:
        self.index, self.count = cfg["index"], cfg["count"]
        self.ch = channel
        self.key: bytes | None = None
        self.job_id = ""
        self.single_host = True
        self.arenas: dict[int, memoryview] = {}
        self._maps: list = []
        self.socks: dict[int, list] = {}            # comm -> [socket]
        self.entries: dict[tuple, _Entry] = {}
        self.closed: collections.OrderedDict = collections.OrderedDict()
        self.held_order: collections.deque = collections.deque()    # (key, nbytes)
        self.held_nbytes = 0
        self.dirty: set = set()                     # (key, rank) with reports pending
        self.counters = {"datagrams": 0, "placed": 0, "placed_nbytes": 0, "dropped": 0,
                         "held_dropped": 0, "recovered_placed": 0}
        self.running = True
        # POLYCAST_FAULTS applies where the workers read datagrams, as the driver's
        # MulticastIO does in-process (the rank checked the spec before it started us)
        self.faults = _faults.from_env(rank=1000 + self.index)
        self.placer = None          # the compiled helper's (set up with the job's key)
        self.native = bool(cfg.get("dgram")) and dgram.available()
        self._fed = lambda _comm, data: self._feed(data)

    # -- commands -------------------------------------------------------------------------
    def command(self, blob: bytes, payload: bytes) -> None:
        kind = D.kind_of(blob)
        if kind == D.W_OPEN:
            self.open_stream(blob, payload)
        elif kind == D.W_DATA:
            rank, key, offset = D.parse_w_data(blob)
            self._recovered(rank, key, offset, payload)
        elif kind == D.W_CLOSE:
            rank, key, token = D.parse_w_close(blob)
            self._close(rank, key)
            self.ch.send(D.w_token(D.W_ACK, token))
        elif kind == D.W_JOIN:
            self._join(D.parse_w_comm(blob), json.loads(payload))
        elif kind == D.W_LEAVE:
            for s in self.socks.pop(D.parse_w_comm(blob), []):
                s.close()
        elif kind == D.W_MAP:
            info = json.loads(payload)
            fd = os.open(info["path"], os.O_RDWR)
            try:
                mm = mmap.mmap(fd, info["nbytes"], mmap.MAP_SHARED)
            finally:
                os.close(fd)
            self._maps.append(mm)
            self.arenas[info["rank"]] = memoryview(mm)
            self.ch.send(D.w_token(D.W_ACK, D.parse_w_token(blob)))
        elif kind == D.W_SETUP:
            info = json.loads(payload)
            self.job_id, self.single_host = info["job_id"], info["single_host"]
            self.key = bytes.fromhex(info["key"]) if info["key"] else None
            if self.native:         # one root's stream per socket: land in place
                self.placer = dgram.Placer(self.key, landing=True)
            self.ch.send(D.w_token(D.W_ACK, D.parse_w_token(blob)))
        elif kind == D.W_STATS:
            self.counters["cpu_s"] = time.process_time()
            self.counters["pid"] = os.getpid()
            self.counters["native"] = self.placer.counters() if self.placer else None
            self.ch.send(D.w_token(D.W_STATS, D.parse_w_token(blob)),
                         json.dumps(self.counters).encode())
        elif kind == D.W_STOP:
            self.running = False

    def _join(self, comm: int, roots: list[int]) -> None:
        from ..transport.mcast import open_group
        socks = self.socks.setdefault(comm, [])
        for root in roots:
            sock, _ = open_group(self.job_id, comm, self.single_host, root=root)
            if self.placer is not None:
                self.placer.watch(sock)
            socks.append(sock)

    def open_stream(self, blob: bytes, payload: bytes) -> None:
        rank, key, sig, isz, ce, nchunks, expected, nelems, base = D.parse_w_open(blob)
        flat = array.array("q")
        flat.frombytes(payload)
        runs = tuple((flat[i], flat[i + 1]) for i in range(0, len(flat), 2))
        s = Stream(0, key[2], key[3], False, runs, nelems, isz, ce * isz)
        s.start("", time.monotonic())
        e = self.entries.get(key)
        if e is None:
            e = self.entries[key] = _Entry()
        e.expected = expected
        e.opened += 1
        d = e.dests[rank] = _Dest(rank, s, base, sig, self.arenas[rank])
        if self.placer is not None:
            self.placer.open(key + (rank,), sig, self.arenas[rank], runs, ce, nchunks,
                             base_nbytes=base, itemsize=isz)
            waiting = e.opened < e.expected     # later openers need the datagrams held
            for k in e.dests:
                self.placer.hold(key + (k,), waiting)
            for _, data in e.held:             # whole datagrams (see datagram())
                self._take(self.placer.feed(data), hand_up=False)   # (held already)
        else:
            for h, data in e.held:
                self._place(e, d, h, data)
        if e.opened >= e.expected:
            self._unhold(key, e)

    def _recovered(self, rank: int, key: tuple, offset: int, payload: bytes) -> None:
        e = self.entries.get(key)
        d = e.dests.get(rank) if e is not None else None
        if d is None:
            return
        s = d.stream
        if self.placer is not None:
            rng = self.placer.write(key + (rank,), offset, payload)
            if rng is None:
                return
        else:
            rng = s.range_chunks(offset, len(payload))
            if rng is None or s.have == s.nchunks:
                return
            self._write(d, s.slice(offset, len(payload)), payload)
            s.mark(rng[0], rng[1], 0.0)
        d.recovered.append(rng)
        self.counters["recovered_placed"] += rng[1] - rng[0]
        self.dirty.add((key, rank))

    def _close(self, rank: int, key: tuple) -> None:
        e = self.entries.get(key)
        if e is None:
            return
        e.dests.pop(rank, None)
        self.dirty.discard((key, rank))
        if self.placer is not None:
            self.placer.close(key + (rank,))
        if not e.dests and e.expected is not None and e.opened >= e.expected:
            self._unhold(key, e)
            del self.entries[key]
            self.closed[key] = True
            if len(self.closed) > CLOSED_KEPT:
                self.closed.popitem(last=False)

    # -- datagrams ------------------------------------------------------------------------
    def _feed(self, data) -> None:
        """One datagram read in Python (POLYCAST_FAULTS acts on what is read)."""
        if self.placer is None:
            self.datagram(data)
        else:
            self._take(self.placer.feed(data))

    def _take(self, got, hand_up: bool = True) -> None:
        """What the helper placed (per local rank's copy of a stream) and handed up
        (``hand_up`` False: a held datagram fed again, whose copies are held already)."""
        progress, up, consumed, nbytes, _ = got
        c = self.counters
        c["datagrams"] += consumed
        c["placed_nbytes"] += nbytes
        for (comm, seq, root, ordinal, rank), ranges, eos in progress:
            key = (comm, seq, root, ordinal)
            e = self.entries.get(key)
            d = e.dests.get(rank) if e is not None else None
            if d is None:
                continue
            for c0, c1 in ranges:
                d.placed.extend((c0, c1))
                c["placed"] += c1 - c0
            d.eos = d.eos or eos
            self.dirty.add((key, rank))
        if hand_up:
            for data, placed in up:
                self.datagram(data, placed)

    def datagram(self, data: bytes, placed: bool = False) -> None:
        """A datagram the helper did not consume (or, ``placed``, a copy to hold for local
        ranks that have not opened its stream yet), or every datagram without it."""
        self.counters["datagrams"] += not placed
        try:
            h, payload = parse_datagram(data, self.key)
        except (WireError, Exception):      # noqa: BLE001 - hostile input: count, drop
            self.counters["dropped"] += 1
            return
        key = (h.comm, h.seq, h.src, h.stream)
        e = self.entries.get(key)
        if e is None:
            if key in self.closed:
                self.counters["dropped"] += 1
                return
            e = self.entries[key] = _Entry()
        if self.placer is None:
            for d in e.dests.values():
                self._place(e, d, h, payload)
        elif e.dests and not placed:
            self.counters["dropped"] += 1       # the helper refused it for every open copy
        if e.expected is None or e.opened < e.expected:
            # (the helper re-reads a held datagram whole when a local rank opens it)
            self._hold(key, e, h, payload if self.placer is None else data)

    def _place(self, e: _Entry, d: _Dest, h, payload) -> None:
        if h.sig != d.sig:
            self.counters["dropped"] += 1
            return
        s = d.stream
        if h.kind is _DATA:
            runs = s.place(h, 0.0)
            if runs.__class__ is str:
                return                      # duplicate, out of range: dropped
            self._write(d, runs, payload)
            d.pending.append(h.tag)
            self.counters["placed"] += 1
            self.counters["placed_nbytes"] += h.length
            self.dirty.add(((h.comm, h.seq, h.src, h.stream), d.rank))
        elif h.kind is _EOS and not s.eos(h):
            d.eos = True
            self.dirty.add(((h.comm, h.seq, h.src, h.stream), d.rank))

    def _write(self, d: _Dest, runs, payload) -> None:
        mv, base, isz = d.mv, d.base, d.stream.itemsize
        pos = 0
        for a, b in runs:
            n = (b - a) * isz
            lo = base + a * isz
            mv[lo:lo + n] = payload[pos:pos + n]
            pos += n

    def _hold(self, key, e: _Entry, h, payload) -> None:
        n = len(payload) + 64
        e.held.append((h, bytes(payload)))
        self.held_order.append((key, n))
        self.held_nbytes += n
        while self.held_nbytes > HOLD_NBYTES and self.held_order:
            k, m = self.held_order.popleft()
            old = self.entries.get(k)
            if old is not None and old.held:
                old.held.pop(0)
                self.held_nbytes -= m
                self.counters["held_dropped"] += 1
                if not old.held and not old.dests and old.expected is None:
                    del self.entries[k]         # a stream nobody here opened (yet)

    def _unhold(self, key, e: _Entry) -> None:
        for h, data in e.held:
            self.held_nbytes -= len(data) + 64
        e.held = []

    # -- reports --------------------------------------------------------------------------
    def report(self) -> None:
        for key, rank in self.dirty:
            e = self.entries.get(key)
            d = e.dests.get(rank) if e is not None else None
            if d is None:
                continue
            if d.pending or d.placed or d.eos:
                ranges = _ranges(d.pending) + array.array("I", d.placed).tobytes()
                d.pending, d.placed = [], []
                flags = D.F_EOS if d.eos else 0
                d.eos = False
                self.ch.send(D.w_progress(rank, key, flags), ranges)
            if d.recovered:
                flat = array.array("I", [c for rng in d.recovered for c in rng]).tobytes()
                d.recovered = []
                self.ch.send(D.w_progress(rank, key, D.F_RECOVERED), flat)
        self.dirty.clear()

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> None:
        ch = self.ch
        while self.running:
            busy = False
            for blob, payload in ch.poll():
                busy = True
                self.command(blob, payload)
            faults = self.faults
            for comm, socks in list(self.socks.items()):
                for sock in socks:
                    if self.placer is not None and faults is None:
                        # no lingering: this loop serves every root's socket and the
                        # offload process's commands (a CLOSE holds up its rank until acked)
                        got = self.placer.recv(sock, READ_BATCH, linger_us=0)
                        if got[2] or got[1]:
                            busy = True
                            self._take(got)
                        continue
                    for _ in range(READ_BATCH):
                        try:
                            data = sock.recv(65536)
                        except (BlockingIOError, InterruptedError):
                            break
                        except OSError:
                            break
                        busy = True
                        if faults is None:
                            self.datagram(data)
                        else:
                            faults.feed(comm, data, self._fed)
                if faults is not None:
                    faults.release(comm, self._fed)
            if self.dirty:
                self.report()
            if busy:
                continue
            if not self._sleep():
                return

    def _sleep(self) -> bool:
        """Sleep until a datagram or a command may be there; False when the offload
        process is gone."""
        ring = self.ch.ring_in
        ring.set_sleeping(True)
        try:
            if ring.pending_input():
                return True
            rlist = [self.ch.sock] + [s for socks in self.socks.values() for s in socks]
            ready, _, _ = select.select(rlist, [], [], IDLE_SECONDS)
        finally:
            ring.set_sleeping(False)
        if self.ch.sock in ready:
            if not self.ch.drain_socket():
                return False
            self.ch.flush()
        return True


def _ranges(chunks: list[int]) -> bytes:
    """Chunk indices as [c0, c1) ranges, packed u32 pairs."""
    chunks.sort()
    out = array.array("I")
    start = prev = None
    for c in chunks:
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            out.extend((start, prev + 1))
            start = prev = c
    if start is not None:
        out.extend((start, prev + 1))
    return out.tobytes()


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    cfg = json.loads(sys.stdin.readline())
    sock = socket.socket(fileno=cfg["fd"])
    n = cfg["ring_nbytes"]
    channel = Channel(sock, Ring.attach(cfg["report"], n), Ring.attach(cfg["cmd"], n))
    Worker(cfg, channel).run()
    return 0


if __name__ == "__main__":
    code = main()
    os._exit(code)
