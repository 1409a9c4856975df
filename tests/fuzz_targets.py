"""Fuzz targets shared by tests/test_fuzz.py (hypothesis, a reduced count in CI) and
bench/fuzz.py (the full count, a seeded mutation fuzzer): the wire parser, the rendezvous
store's protocol and the engine's message handling.

Each ``check_*`` feeds one input and raises AssertionError when an invariant breaks; any
other exception escaping it is a crash. The invariants:

* wire: the parsers raise :class:`WireError` or return a header that packs back to the same
  bytes (the 3 pad bytes aside, which are ignored); with a secret, only an authentic message
  is accepted.
* store: a client without the secret is refused; forged, altered, replayed or malformed
  frames end that connection (counted) and never the server: a genuine client is served
  afterwards, promptly, and the server holds no connection of a client that left.
* engine: on 4 ranks of the in-process test world, hostile messages and datagrams (built from
  genuine ones of the call in progress, then mutated field by field and byte by byte) never
  raise, never hang (every request completes or fails with a polycast error within the
  virtual timeout), never change a send buffer or a byte outside a receive buffer; under a
  secret, forged datagrams change nothing at all (every rank completes with exact results).
"""

from __future__ import annotations

import random
import socket
import time

import numpy as np

from polycast.engine import wire
from polycast.engine.config import EngineConfig
from polycast.errors import PolycastError
from polycast.runtime.bootstrap import auth
from polycast.runtime.bootstrap.store import (_HDR, OP_ADD, OP_GET, OP_SET, OP_WAIT, StoreClient,
                                    StoreServer, _frame_mac, store_key)

SECRET = b"fuzz-secret-0123456789abcdef"
INTERESTING = (0, 1, 2, 3, 4, 7, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 0x7FFFFFFF,
               0x80000000, 0xFFFFFFFE, 0xFFFFFFFF, 1 << 31, (1 << 32), (1 << 63),
               (1 << 64) - 1)
_FIELDS = ("comm", "seq", "src", "tag", "stream", "offset", "length", "sig", "flags", "kind")
_WIDTH = {"comm": 32, "seq": 32, "src": 32, "tag": 32, "stream": 32, "offset": 64,
          "length": 32, "sig": 32, "flags": 8, "kind": 8}


# -- mutation (used by the bench's fuzzer; hypothesis draws its own) --------------------------

def mutate(rng: random.Random, data: bytes, corpus=()) -> bytes:
    """One to four byte-level mutations of ``data``: flips, interesting bytes and words,
    truncation, extension, duplication of a slice, splicing with another corpus entry."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        m = rng.randrange(8)
        if m == 0 and b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif m == 1 and b:
            b[rng.randrange(len(b))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif m == 2 and len(b) >= 4:
            i = rng.randrange(len(b) - 3)
            b[i:i + 4] = (rng.choice(INTERESTING) & 0xFFFFFFFF).to_bytes(4, "big")
        elif m == 3 and b:
            del b[rng.randrange(len(b) + 1):]
        elif m == 4:
            b += rng.randbytes(rng.randint(1, 64))
        elif m == 5 and b:
            i = rng.randrange(len(b))
            j = rng.randint(i, min(len(b), i + 32))
            b[i:i] = b[i:j]
        elif m == 6 and corpus:
            other = rng.choice(corpus)
            i = rng.randrange(len(b) + 1)
            b = b[:i] + other[min(i, len(other)):]
        else:
            b = bytearray(rng.randbytes(rng.randint(0, 96)))
    return bytes(b)


# -- the wire parser ------------------------------------------------------------------------

def wire_corpus(rng: random.Random | None = None) -> list[bytes]:
    """Genuine messages and datagrams of every kind, with and without a MAC."""
    rng = rng or random.Random(0)
    out = []
    for kind in wire.MsgKind:
        for secret in (None, SECRET):
            n = 0 if kind in (wire.MsgKind.FIN, wire.MsgKind.CTS, wire.MsgKind.MCAST_EOS) \
                else rng.choice((1, 8, 40))
            flags = wire.F_NO_PAYLOAD if kind in (wire.MsgKind.RECOVER_REQ,
                                                  wire.MsgKind.RTS) else 0
            payload = b"" if flags else rng.randbytes(n)
            h = wire.make_header(kind, 7, 3, 1, 2, 64, n, 0xABCD1234, 1, flags)
            out.append(h.pack(secret, payload) + payload)
    return out


def _same_but_pad(a: bytes, b: bytes) -> bool:
    return a[:5] + a[8:] == b[:5] + b[8:]


def check_wire(data: bytes) -> str:
    """Both parsers, with and without a secret. Returns what happened (for statistics)."""
    outcome = []
    for secret in (None, SECRET):
        try:
            h = wire.parse_header(data, secret)
        except wire.WireError as e:
            outcome.append(e.reason)
        else:
            start = wire.HEADER_NBYTES + (wire.MAC_NBYTES if secret else 0)
            payload = bytes(data[start:start + h.payload_nbytes])
            if len(payload) == h.payload_nbytes:
                packed = h.pack(secret, payload)
                assert _same_but_pad(packed, bytes(data[:start])), (data, h)
                if secret:      # accepted under a secret: the MAC was right
                    wire.verify_mac(h, payload, secret)
            outcome.append("header")
        try:
            h, payload = wire.parse_datagram(data, secret)
        except wire.WireError as e:
            outcome.append(e.reason)
        else:
            assert h.kind in (wire.MsgKind.MCAST_DATA, wire.MsgKind.MCAST_EOS), h
            assert _same_but_pad(h.pack(secret, payload) + bytes(payload), bytes(data)), h
            outcome.append("datagram")
    return "/".join(outcome)


# -- the rendezvous store ---------------------------------------------------------------------

class StoreTarget:
    """A store server with a secret, and ways to hit it with hostile clients."""

    def __init__(self) -> None:
        self.server = StoreServer("127.0.0.1", 0, SECRET)
        self.port = self.server.port
        self._key = store_key(SECRET)
        self.inputs = 0
        self.answers = 0            # handshake answers long enough to be judged
        self._checks = 0

    def close(self) -> None:
        self.server.close()

    def _connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")  # RST, no TIME_WAIT
        return s

    def handshake(self, answer: bytes) -> None:
        """A client that answers the challenge with ``answer`` (not knowing the secret)."""
        self.inputs += 1
        self.answers += len(answer) >= auth.NONCE_NBYTES + auth.MAC_NBYTES
        with self._connect() as s:
            nonce = auth.recv_exact(s, auth.NONCE_NBYTES)
            assert len(nonce) == auth.NONCE_NBYTES
            s.sendall(answer)

    def session(self) -> tuple[socket.socket, bytes]:
        s = self._connect()
        return s, auth.connect_handshake(s, self._key, b"store")

    def frames(self, frames: list[tuple[int, bytes, bytes]], tamper: list[bytes]) -> None:
        """An authenticated client sending ``(op, key, value)`` frames with right MACs (the
        protocol past the MAC: any op, key bytes, value), then raw ``tamper`` bytes (forged,
        altered or replayed frames). It leaves without reading replies (the server must not
        care); :meth:`healthy` checks the server afterwards."""
        s, session = self.session()
        try:
            tx = 0
            for op, key, value in frames:
                self.inputs += 1
                frame = _HDR.pack(op, len(key), len(value)) + key + value
                try:
                    s.sendall(frame + _frame_mac(session, b"c", tx, frame))
                except OSError:
                    return                  # the server ended it: allowed
                tx += 1
            for raw in tamper:
                self.inputs += 1
                try:
                    s.sendall(raw)
                except OSError:
                    return
        finally:
            s.close()

    def healthy(self, timeout_s: float = 5.0) -> None:
        """A genuine client is served promptly; no connection of a departed client stays."""
        self._checks += 1
        t0 = time.monotonic()
        key = f"health/{self._checks}"
        with StoreClient("127.0.0.1", self.port, timeout_seconds=timeout_s,
                         secret=SECRET) as c:
            c.set(key, b"ok")
            assert c.get(key) == b"ok"
            assert c.add(key + "/n", 2) == 2
        assert time.monotonic() - t0 < timeout_s
        deadline = time.monotonic() + timeout_s
        while len(self.server._conns) > 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(self.server._conns) == 0, f"{len(self.server._conns)} connections left"
        assert self.server._thread.is_alive()


STORE_OPS = (OP_SET, OP_GET, OP_WAIT, OP_ADD, 0, 5, 0xFF)


def genuine_frames(session: bytes, frames, start: int = 0) -> list[bytes]:
    out = []
    for i, (op, key, value) in enumerate(frames):
        f = _HDR.pack(op, len(key), len(value)) + key + value
        out.append(f + _frame_mac(session, b"c", start + i, f))
    return out


# -- the engine -----------------------------------------------------------------------------

GUARD = 16          # elements of guard on each side of every receive buffer


def _schedules():
    from polycast.algorithms import build
    return [build("allgather", "mcast", 4, 48, nchunks=2),
            build("broadcast", "mcast", 4, 96, root=1, nchunks=2),
            build("allreduce", "mcast", 4, 64),
            build("allgather", "ring", 4, 48),
            build("allreduce", "ring", 4, 64)]


_SCHEDULES: list = []


def schedules():
    if not _SCHEDULES:
        _SCHEDULES.extend(_schedules())
    return _SCHEDULES


class EngineCase:
    """One collective posted on 4 ranks of the test world, hostile inputs injected into
    rank ``victim`` before and while it runs."""

    def __init__(self, which: int, secret: bool, seed: int = 0) -> None:
        from world import World                   # tests/world.py (on sys.path)
        from polycast.reference import make_inputs
        self.schedule = schedules()[which % len(schedules())]
        self.secret = secret
        cfg = EngineConfig(secret=SECRET if secret else None, op_timeout_s=5.0,
                           recovery_timeout_s=0.01)
        self.world = World(4, cfg, seed=seed, raw=True)
        coll = self.schedule.collective
        self.inputs = make_inputs(coll, 4, self.schedule.count, "float32",
                                  self.schedule.root, seed, "sum")
        _, nrecv = coll.buffer_counts(4, self.schedule.count)
        self.sends = [None if x is None else x.copy() for x in self.inputs]
        self.backing = [np.full(nrecv + 2 * GUARD, -7, np.float32) for _ in range(4)]
        self.recvs = [b[GUARD:GUARD + nrecv] for b in self.backing]
        self.reqs = [self.world.post(r, self.schedule, self.sends[r], self.recvs[r], "sum")
                     for r in range(4)]
        eng = self.world.engines[1]
        self.seq = 0
        self.sig = eng._by_seq[0].sig
        self.victim = 1

    def genuine(self, rng: random.Random) -> tuple[wire.Header, bytes]:
        """A plausible message of this call: any kind, right comm/seq/sig, fields near
        their valid ranges."""
        kind = rng.choice(list(wire.MsgKind))
        src = rng.choice((0, 2, 3))
        nbytes = rng.choice((0, 4, 16, 64, 192))
        flags = 0
        if kind in (wire.MsgKind.RECOVER_REQ, wire.MsgKind.RTS):
            flags = wire.F_NO_PAYLOAD
        if kind in (wire.MsgKind.FIN, wire.MsgKind.CTS, wire.MsgKind.MCAST_EOS):
            nbytes = 0
        payload = b"" if flags else rng.randbytes(nbytes)
        if kind is wire.MsgKind.ABORT:
            payload = rng.choice((b"", b"fuzz abort", bytes([0xff, 0xfe])))
            nbytes = len(payload)
        h = wire.make_header(kind, 0, self.seq, src, rng.randrange(6),
                             rng.choice((0, 4, 16, 64, 128)), nbytes, self.sig,
                             rng.choice((0, 1, 2)), flags)
        return h, payload

    def mutate_fields(self, rng: random.Random, h: wire.Header, payload: bytes
                      ) -> tuple[wire.Header, bytes]:
        vals = {f: getattr(h, f) for f in _FIELDS}
        vals["kind"] = int(h.kind)
        for _ in range(rng.randint(0, 3)):
            f = rng.choice(_FIELDS)
            mask = (1 << _WIDTH[f]) - 1
            vals[f] = rng.choice((rng.choice(INTERESTING), vals[f] + rng.choice((-1, 1)),
                                  rng.randrange(1 << _WIDTH[f]))) & mask
        kind = wire._KINDS.get(vals["kind"])
        if kind is None:
            kind = h.kind
        if rng.random() < 0.2:
            payload = payload[:rng.randrange(len(payload) + 1)] + rng.randbytes(
                rng.choice((0, 0, 1, 4)))
        h2 = wire.make_header(kind, vals["comm"], vals["seq"], vals["src"], vals["tag"],
                              vals["offset"], vals["length"], vals["sig"], vals["stream"],
                              vals["flags"] & (wire.F_NO_PAYLOAD | wire.F_MAC))
        if not h2.flags & wire.F_NO_PAYLOAD:
            # the reliable channel frames by the header: a message carries what it announces
            payload = (payload + bytes(h2.length))[:h2.length] if h2.length <= 4096 else None
        else:
            payload = b""
        return h2, payload

    def message(self, h: wire.Header, payload) -> None:
        """As the driver hands a reliable-channel message to the engine (already framed
        and, under a secret, authenticated by the channel: this is an insider's input)."""
        if payload is None:
            return
        src = h.src if h.src < 4 and h.src != self.victim else 0
        self.world.inject_message(self.victim, src, h, payload)

    def datagram(self, data: bytes) -> None:
        self.world.inject_datagram(self.victim, data)

    def datagram_from(self, h: wire.Header, payload: bytes, forge_mac: bool) -> bytes:
        """Wire bytes of a datagram; under a secret, with a MAC made with a wrong key (an
        attacker's) unless ``forge_mac`` is False and the secret is unset."""
        key = (b"attacker-key" if forge_mac else SECRET) if self.secret else None
        return h.pack(key, payload) + payload

    def advance(self, seconds: float) -> None:
        self.world.advance(seconds)

    def finish(self, exact: bool) -> str:
        """Run to the end; check the invariants. Returns "exact", "failed" or "done"."""
        w = self.world
        w.run(max_time_s=w.now + 30.0)       # raises AssertionError when a request is stuck
        for r in range(4):
            assert self.sends[r] is None or np.array_equal(self.sends[r], self.inputs[r]), \
                f"rank {r}'s send buffer changed"
            b = self.backing[r]
            assert (b[:GUARD] == -7).all() and (b[-GUARD:] == -7).all(), \
                f"rank {r}: bytes outside its receive buffer changed"
        failed = {k: e for k, e in w.errors.items()}
        for k, e in failed.items():
            assert isinstance(e, PolycastError), f"rank {k}: not a polycast error: {e!r}"
        if exact:
            assert not failed, f"forged datagrams failed a call: {failed}"
            from polycast.reference import reference
            want = reference(self.schedule.collective, self.inputs, self.schedule.root, "sum")
            for r in range(4):
                if want[r] is not None:
                    np.testing.assert_array_equal(self.recvs[r], want[r])
            return "exact"
        return "failed" if failed else "done"


# -- the compiled datagram path (runtime/transport/_dgram.c) ----------------------------------

class DgramTarget:
    """The compiled helper's parser and placement, checked datagram by datagram against the
    Python reference (engine/wire.py's parse_datagram, engine/mcast.py's Stream).

    One Placer (with or without the secret) with two open streams over one buffer of bytes
    with guards around and a gap between the first stream's runs. Each input is fed; the
    helper must consume exactly what the reference places or drops as a duplicate, write
    exactly the reference's element runs with the payload (nothing else: not the gap, not
    the guards, not on a handed-up datagram), and hand everything else up untouched. Under
    a secret a datagram is consumed only when its MAC verifies."""

    ISZ = 4
    GUARD_NBYTES = 64
    # (comm, seq, src, stream), sig, runs (elements), chunk elements
    STREAMS = (((7, 3, 1, 0), 0xABCD1234, ((0, 50), (60, 100)), 16),
               ((7, 3, 2, 1), 0x01020304, ((100, 164),), 10))

    def __init__(self, secret: bytes | None) -> None:
        from polycast.runtime.transport import dgram
        self.dgram = dgram
        self.secret = secret
        self.nbytes = 164 * self.ISZ
        self.buf = np.zeros(self.GUARD_NBYTES * 2 + self.nbytes, np.uint8)
        self.inputs = 0
        self.outcomes: dict[str, int] = {}
        self.reset()

    def reset(self) -> None:
        from polycast.engine.mcast import Stream
        self.placer = self.dgram._dgram.Placer(self.secret)
        self.buf[:] = 0xAB
        self.ref = {}
        for h, (key, sig, runs, ce) in enumerate(self.STREAMS):
            nelems = sum(b - a for a, b in runs)
            s = Stream(h, key[2], key[3], False, runs, nelems, self.ISZ, ce * self.ISZ)
            s.start("recv", 0.0)
            self.placer.open(h, *key, sig, self.buf, self.GUARD_NBYTES,
                             self.dgram.runs_bytes(runs), self.ISZ, ce, s.nchunks, nelems)
            self.ref[key] = (s, sig)

    def corpus(self, rng: random.Random) -> list[bytes]:
        """Every chunk and the EOS of both streams (and of a foreign and a stale one)."""
        out = []
        for key, sig, runs, ce in self.STREAMS + (((8, 3, 1, 0), 5, ((0, 20),), 16),
                                                 ((7, 2, 1, 0), 0xABCD1234, ((0, 90),), 16)):
            nelems = sum(b - a for a, b in runs)
            nchunks = -(-nelems // ce)
            for i in range(nchunks + 1):
                if i < nchunks:
                    n = min(ce, nelems - i * ce) * self.ISZ
                    payload = rng.randbytes(n)
                    h = wire.make_header(wire.MsgKind.MCAST_DATA, key[0], key[1], key[2], i,
                                         i * ce * self.ISZ, n, sig, key[3])
                else:
                    payload = b""
                    h = wire.make_header(wire.MsgKind.MCAST_EOS, key[0], key[1], key[2],
                                         nchunks, nelems * self.ISZ, 0, sig, key[3])
                out.append(h.pack(self.secret, payload) + payload)
        return out

    def check(self, data: bytes) -> str:
        self.inputs += 1
        before = self.buf.copy()
        _, up, consumed, _, _, _ = self.placer.feed(data)
        expect, runs, payload = self._reference(data)
        g = self.GUARD_NBYTES
        if expect in ("placed", "duplicate", "eos", "duplicate_eos"):
            assert consumed == 1 and not up, (expect, data)
            want = before.copy()
            if runs:
                pos = 0
                for a, b in runs:
                    n = (b - a) * self.ISZ
                    want[g + a * self.ISZ:g + a * self.ISZ + n] = np.frombuffer(
                        payload[pos:pos + n], np.uint8)
                    pos += n
            assert np.array_equal(self.buf, want), (expect, data)
        else:
            assert consumed == 0 and len(up) == 1 and up[0][0] == data, (expect, data)
            assert np.array_equal(self.buf, before), (expect, data)
        self.outcomes[expect] = self.outcomes.get(expect, 0) + 1
        return expect

    def _reference(self, data: bytes):
        try:
            h, payload = wire.parse_datagram(data, self.secret)
        except wire.WireError as e:
            return e.reason, None, None
        ent = self.ref.get((h.comm, h.seq, h.src, h.stream))
        if ent is None:
            return "not_open", None, None
        s, sig = ent
        if h.sig != sig:
            return "bad_sig", None, None
        if h.kind is wire.MsgKind.MCAST_DATA:
            r = s.place(h, 0.0)
            if isinstance(r, str):
                return ("duplicate" if r == "duplicate" else r), None, None
            return "placed", r, bytes(payload)
        why = s.eos(h)
        return (why or "eos"), None, None


# -- the helper's landing, over a real socket ---------------------------------------------------

def _data_datagram(key, i: int, offset: int, payload: bytes, sig: int, secret) -> bytes:
    comm, seq, src, stream = key
    h = wire.make_header(wire.MsgKind.MCAST_DATA, comm, seq, src, i, offset, len(payload), sig,
                         stream)
    return h.pack(secret, payload) + payload


def landing_run(secret, order: str, gso: bool, streams: int, n: int = 300, csz: int = 1400,
                 seed: int = 0, groups: tuple = (64,)):
    """``streams`` streams of ``n`` chunks sent to a landing placer (in order, shuffled, or
    with half of them again), with a corrupted copy after 5 % of the datagrams when not in
    order, in sends of ``groups`` datagrams in turn (with ``gso``: GRO buffers of those
    counts). Returns (every buffer exact, counters)."""
    rng = random.Random(seed)
    from polycast.runtime.transport import dgram
    p = dgram.Placer(secret, landing=True)
    keys = [(1, 2, r, 0) for r in range(streams)]
    bufs = [np.full(n * csz, 0xEE, np.uint8) for _ in keys]
    srcs = [np.frombuffer(rng.randbytes(n * csz), np.uint8) for _ in keys]
    for k, b in zip(keys, bufs):
        p.open(k, 7, b, ((0, n * csz),), csz, n)
    items = [_data_datagram(k, i, i * csz, srcs[j][i * csz:(i + 1) * csz].tobytes(), 7, secret)
             for i in range(n) for j, k in enumerate(keys)]
    if order == "shuffle":
        rng.shuffle(items)
    elif order == "dups":
        items += items[:n // 2]
    wires = []
    for w in items:
        wires.append(w)
        if order != "inorder" and rng.random() < 0.05:
            bad = bytearray(w)
            bad[rng.randrange(len(bad))] ^= 0xFF
            wires.append(bytes(bad))
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
        rx.bind(("127.0.0.1", 0))
        rx.setblocking(False)
        tx.setblocking(False)
        p.watch(rx)
        sent = 0
        for i in range(5000):
            if sent < len(wires):
                batch = wires[sent:sent + groups[i % len(groups)]]
                if gso:
                    sent += dgram.send(tx, rx.getsockname(), [(w, None) for w in batch])
                else:
                    for w in batch:
                        tx.sendto(w, rx.getsockname())
                    sent += len(batch)
            _, up, consumed, _, _ = p.recv(rx, 256)
            if sent >= len(wires) and not consumed and not up:
                break
    finally:
        rx.close()
        tx.close()
    return all(np.array_equal(b, x) for b, x in zip(bufs, srcs)), p.counters()
