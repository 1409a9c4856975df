"""The compiled multicast datagram path (runtime/transport/_dgram.c): its MAC is BLAKE2b;
it places exactly what the Python reference places and hands everything else up untouched
(fuzzed here with hypothesis, 100,000 inputs in bench/fuzz.py); batches over a real socket
(recvmmsg, sendmmsg, UDP GSO/GRO where the kernel has them); and the runtime gives the same
results with it and without it (the dgram=0 test hook), with and without a secret."""

from __future__ import annotations

import hashlib
import os
import random
import socket
import subprocess
import sys

import numpy as np
import pytest

from polycast.engine import wire
from polycast.runtime.transport import dgram

pytestmark = pytest.mark.skipif(not dgram.available(),
                                reason=f"the datagram helper is not built: {dgram.why_not}")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fuzz_targets as ft  # noqa: E402

SECRET = ft.SECRET


def test_mac_is_blake2b_keyed_16_bytes():
    rng = random.Random(5)
    for _ in range(300):
        key = rng.randbytes(rng.choice((0, 1, 16, 32, 63, 64)))
        a = rng.randbytes(rng.choice((0, 44, 100)))
        b = rng.randbytes(rng.choice((0, 1, 84, 128, 129, 256, rng.randrange(20000))))
        assert dgram._dgram.mac(key, a, b) == hashlib.blake2b(a + b, key=key,
                                                               digest_size=16).digest()


def _datagram(kind, key, i, offset, payload, sig, secret=None):
    comm, seq, src, stream = key
    h = wire.make_header(kind, comm, seq, src, i, offset, len(payload), sig, stream)
    return h.pack(secret, payload) + payload


@pytest.mark.parametrize("secret", [None, SECRET])
def test_places_chunks_of_an_open_stream_and_reports_them_merged(secret):
    p = dgram.Placer(secret)
    key = (4, 9, 1, 0)
    buf = np.zeros(130, np.float32)
    runs = ((0, 40), (50, 130))                     # a gap the stream skips: 10 elements
    p.open(key, 77, buf, runs, 16, 8)              # 120 elements, chunks of 16: 8 chunks
    src = np.arange(120, dtype=np.float32) + 1
    dgs = [_datagram(wire.MsgKind.MCAST_DATA, key, i, i * 64, src[i * 16:(i + 1) * 16].tobytes(),
                     77, secret) for i in range(8)]
    ranges, consumed = [], 0
    for i in (0, 1, 2, 5, 4, 3, 7, 6, 6):
        prog, up, n, nbytes, drops = p.feed(dgs[i])
        assert up == []
        consumed += n
        ranges += [r for (_, rr, _) in prog for r in rr]
    assert consumed == 9 and drops == {"duplicate": 1}
    want = np.zeros(130, np.float32)
    want[:40], want[50:] = src[:40], src[40:]
    assert np.array_equal(buf, want)
    assert sorted(ranges) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 8)] \
        or sum(b - a for a, b in ranges) == 8
    eos = _datagram(wire.MsgKind.MCAST_EOS, key, 8, 480, b"", 77, secret)
    prog, up, n, _, _ = p.feed(eos)
    assert prog == [(key, [], True)] and n == 1
    assert p.feed(eos)[4] == {"duplicate_eos": 1}
    c = p.counters()
    assert c["placed"] == 8 and c["placed_nbytes"] == 480 and c["eos"] == 1


def test_one_call_reports_ranges_merged():
    """Chunks placed in order in one batch come back as one range."""
    p = dgram.Placer(None)
    key = (1, 1, 0, 0)
    buf = np.zeros(64, np.uint8)
    p.open(key, 1, buf, ((0, 64),), 8, 8)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind(("127.0.0.1", 0))
        rx.setblocking(False)
        for i in range(8):
            tx.sendto(_datagram(wire.MsgKind.MCAST_DATA, key, i, 8 * i, bytes([i]) * 8, 1),
                      rx.getsockname())
        prog, up, n, _, _ = p.recv(rx, 64)
    finally:
        rx.close()
        tx.close()
    assert n == 8 and up == [] and prog == [(key, [(0, 8)], False)]
    assert bytes(buf) == b"".join(bytes([i]) * 8 for i in range(8))


@pytest.mark.parametrize("secret", [None, SECRET])
def test_hands_up_untouched_what_it_cannot_decide(secret):
    """Truncated, oversized, malformed, for another job/communicator/collective/stream,
    with a bad or missing MAC, a bad signature or chunk geometry: handed up byte for byte,
    never placed (the engine drops and counts them); replays of placed chunks are consumed
    as duplicates, never placed again."""
    p = dgram.Placer(secret)
    key = (4, 9, 1, 0)
    buf = np.zeros(64, np.float32)
    p.open(key, 77, buf, ((0, 64),), 16, 4)
    good = _datagram(wire.MsgKind.MCAST_DATA, key, 1, 64, b"\x01" * 64, 77, secret)
    start = wire.HEADER_NBYTES + (wire.MAC_NBYTES if secret else 0)
    bad = {
        "truncated": good[:-1],
        "oversized": good + b"\0",
        "header only": good[:20],
        "bad magic": b"\0" + good[1:],
        "foreign comm": _datagram(wire.MsgKind.MCAST_DATA, (5, 9, 1, 0), 1, 64, b"\1" * 64, 77,
                                  secret),
        "stale collective": _datagram(wire.MsgKind.MCAST_DATA, (4, 8, 1, 0), 1, 64, b"\1" * 64,
                                      77, secret),
        "other root": _datagram(wire.MsgKind.MCAST_DATA, (4, 9, 2, 0), 1, 64, b"\1" * 64, 77,
                                secret),
        "bad signature": _datagram(wire.MsgKind.MCAST_DATA, key, 1, 64, b"\1" * 64, 78, secret),
        "bad offset": _datagram(wire.MsgKind.MCAST_DATA, key, 1, 68, b"\1" * 64, 77, secret),
        "chunk out of range": _datagram(wire.MsgKind.MCAST_DATA, key, 4, 256, b"\1" * 64, 77,
                                        secret),
        "bad eos": _datagram(wire.MsgKind.MCAST_EOS, key, 5, 256, b"", 77, secret),
        "other kind": wire.make_header(wire.MsgKind.FIN, 4, 9, 1, 0, 0, 0, 77).pack(secret),
    }
    if secret:
        forged = bytearray(good)
        forged[start] ^= 1                          # payload changed, MAC kept
        bad["bad mac"] = bytes(forged)
        bad["no mac"] = _datagram(wire.MsgKind.MCAST_DATA, key, 1, 64, b"\1" * 64, 77)
    else:
        bad["unexpected mac"] = _datagram(wire.MsgKind.MCAST_DATA, key, 1, 64, b"\1" * 64, 77,
                                          SECRET)
    for what, data in bad.items():
        prog, up, n, _, _ = p.feed(data)
        assert up == [(data, False)] and n == 0 and prog == [], what
        assert not buf.any(), what
    assert p.feed(good)[2] == 1 and buf[16:32].view(np.uint32).tolist() == [0x01010101] * 16
    buf[:] = 0
    assert p.feed(good)[4] == {"duplicate": 1} and not buf.any()     # a replay: not placed
    if secret:
        assert p.counters()["bad_mac"] == 1


def test_open_refuses_runs_outside_the_buffer():
    p = dgram._dgram.Placer(None)
    buf = np.zeros(100, np.uint8)
    for base, runs, nelems, why in ((0, ((0, 26),), 26, "outside"),
                                    (8, ((0, 24),), 24, "outside"),
                                    (0, ((5, 3),), 0, "outside"),
                                    (0, ((0, 10),), 12, "nelems"),
                                    (101, ((0, 1),), 1, "base")):
        with pytest.raises(ValueError, match=why):
            p.open(1, 0, 0, 0, 0, 0, buf, base, dgram.runs_bytes(runs), 4, 4, -(-nelems // 4),
                   nelems)
    with pytest.raises(BufferError):
        p.open(1, 0, 0, 0, 0, 0, b"read-only", 0, dgram.runs_bytes(((0, 1),)), 1, 1, 1, 1)
    p.open(1, 0, 0, 0, 0, 0, buf, 4, dgram.runs_bytes(((0, 24),)), 4, 4, 6, 24)
    with pytest.raises(ValueError, match="open already"):
        p.open(1, 0, 0, 0, 0, 0, buf, 4, dgram.runs_bytes(((0, 24),)), 4, 4, 6, 24)
    assert p.close(1) is True and p.close(1) is False


def test_recovered_bytes_hold_and_close():
    p = dgram.Placer(None)
    key = (1, 2, 3, 0)
    buf = np.zeros(40, np.int32)
    p.open(key, 9, buf, ((0, 40),), 8, 5)
    assert p.write(key, 32, np.arange(16, dtype=np.int32).tobytes()) == (1, 3)
    assert buf[8:24].tolist() == list(range(16)) and not buf[:8].any()
    assert p.write(key, 4, b"\0" * 8) is None                  # not chunk-aligned
    assert p.write(key, 128, b"\0" * 64) is None               # past the stream
    assert p.write(key, 128, b"\7" * 32) == (4, 5)             # the last chunk
    d = _datagram(wire.MsgKind.MCAST_DATA, key, 0, 0, b"\5" * 32, 9)
    p.hold(key, True)                          # other local ranks have not opened it yet
    prog, up, n, _, _ = p.feed(d)
    assert n == 1 and up == [(d, True)] and buf[0] == 0x05050505
    p.close(key)
    buf[:] = 0
    d2 = _datagram(wire.MsgKind.MCAST_DATA, key, 2, 64, b"\5" * 32, 9)
    assert p.feed(d2)[1] == [(d2, False)] and not buf.any()     # closed: nothing written


def test_send_batches_and_recv_over_loopback_gso_gro():
    """300 datagrams of one size leave in GSO batches and are read back in recvmmsg batches
    (GRO-coalesced where the kernel does it), every chunk in place."""
    p = dgram.Placer(None)
    key = (2, 5, 0, 0)
    n, csz = 300, 1400
    buf = np.zeros(n * csz, np.uint8)
    p.open(key, 3, buf, ((0, n * csz),), csz, n)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        rx.bind(("127.0.0.1", 0))
        rx.setblocking(False)
        tx.setblocking(False)
        gro = p.watch(rx)
        rng = np.random.default_rng(1)
        src = rng.integers(0, 256, n * csz, dtype=np.uint8)
        items = [(wire.make_header(wire.MsgKind.MCAST_DATA, 2, 5, 0, i, i * csz, csz, 3, 0)
                  .pack(), memoryview(src[i * csz:(i + 1) * csz])) for i in range(n)]
        sent = 0
        for _ in range(100):
            sent += dgram.send(tx, rx.getsockname(), items[sent:])
            got = p.recv(rx, 1024)
            assert got[1] == []
            if sent == n and p.counters()["placed"] == n:
                break
    finally:
        rx.close()
        tx.close()
    assert np.array_equal(buf, src)
    c = p.counters()
    assert c["placed"] == n and c["syscalls"] < n
    print(f"GRO {'on' if gro else 'off'}: {c['gro_buffers']} coalesced buffers, "
          f"{c['syscalls']} recvmmsg calls for {n} datagrams; GSO "
          f"{'available' if dgram._dgram.gso_available() else 'refused'}")


@pytest.mark.parametrize("secret", [None, SECRET])
@pytest.mark.parametrize("runs,itemsize,ce,gso", [
    (((0, 10000),), 4, 350, True),                     # one run, a short last chunk
    (((3, 900), (1000, 1001), (2000, 4111)), 8, 97, True),   # chunks across runs
    (((0, 4096),), 2, 1024, False),                    # plain sendmmsg, chunks exact
])
def test_send_chunks_builds_the_engines_datagrams(secret, runs, itemsize, ce, gso):
    """send_chunks sends a stream's chunks [c0, c1) as exactly the datagrams the engine's
    Python path builds for them (chunk_datagrams + Header.pack), MAC included."""
    from polycast.engine.actions import MulticastChunks, Region
    from polycast.engine.mcast import chunk_datagrams
    nelems = sum(b - a for a, b in runs)
    nchunks = -(-nelems // ce)
    buf = np.random.default_rng(7).integers(0, 256, runs[-1][1] * itemsize, dtype=np.uint8)
    head = wire.make_header(wire.MsgKind.MCAST_DATA, 9, 0xFFFFFFF0, 2, 0, 0, 0, 0xABCDEF, 3)
    a = MulticastChunks(head, Region(1, "send", runs, nelems * itemsize), itemsize, ce,
                        nchunks, 0.0, 0.0)
    want = []
    for d in chunk_datagrams(a):
        payload = b"".join(bytes(buf[x * itemsize:y * itemsize]) for x, y in d.payload.runs)
        want.append(d.header.pack(secret, payload) + payload)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    got = []
    try:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(5)
        c0, c1 = 1, nchunks                    # from a chunk past the first, as when paced
        sent = dgram._dgram.send_chunks(tx.fileno(), rx.getsockname(), secret, 9, 0xFFFFFFF0,
                                        2, 0xABCDEF, 3, buf, dgram.runs_bytes(runs), itemsize,
                                        ce, nelems, c0, c1, gso)
        assert sent == c1 - c0
        for _ in range(sent):
            got.append(rx.recv(65536))
        with pytest.raises(ValueError, match="outside the buffer"):
            dgram._dgram.send_chunks(tx.fileno(), rx.getsockname(), secret, 9, 1, 2, 3, 3,
                                     buf[:-1], dgram.runs_bytes(runs), itemsize, ce, nelems,
                                     0, 1)
        with pytest.raises(ValueError, match="at most one datagram"):
            dgram._dgram.send_chunks(tx.fileno(), rx.getsockname(), secret, 9, 1, 2, 3, 3,
                                     buf, dgram.runs_bytes(runs), itemsize, 1 << 62,
                                     nelems, 0, 1)
        with pytest.raises(ValueError, match="not the stream's"):
            dgram._dgram.send_chunks(tx.fileno(), rx.getsockname(), secret, 9, 1, 2, 3, 3,
                                     buf, dgram.runs_bytes(runs), itemsize, ce, nelems,
                                     0, nchunks + 1)
    finally:
        rx.close()
        tx.close()
    assert got == want[c0:c1]


def test_a_blocked_stream_sends_from_its_own_copy_and_its_eos_after_it(monkeypatch):
    """When the socket's buffer fills mid-stream (the helper sends fewer chunks than asked),
    the rest of the stream leaves from a copy: the request may end and its buffer be reused
    before the socket drains. A datagram queued meanwhile (the EOS) leaves after them."""
    import selectors

    from polycast.engine.actions import MulticastChunks, Region
    from polycast.memory import Buffers
    from polycast.runtime.driver import datagrams as D
    sel = selectors.DefaultSelector()
    io = D.MulticastIO(sel, lambda *a: None, send_chunks=True)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    real = dgram.send_chunks
    full = {"on": True}

    def first_three_then_full(sock, addr, args, c0, c1):
        if full["on"]:
            return real(sock, addr, args, c0, min(c1, 3)) if c0 < 3 else 0
        return real(sock, addr, args, c0, c1)
    monkeypatch.setattr(dgram, "send_chunks", first_three_then_full)
    try:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(5)
        tx.setblocking(False)
        io._groups[1] = D._Group(tx, rx.getsockname())
        sel.register(tx, selectors.EVENT_READ, ("mcast", 1))
        bufs = Buffers()
        arr = np.arange(1000, dtype=np.float32)
        want = arr.copy()
        bufs.register_arrays(7, send=arr)
        head = wire.make_header(wire.MsgKind.MCAST_DATA, 1, 4, 0, 0, 0, 0, 5, 0)
        io.send_chunks(1, MulticastChunks(head, Region(7, "send", ((0, 1000),), 4000), 4, 100,
                                          10, 0.0, 0.0), bufs, None)
        eos = wire.Header(wire.MsgKind.MCAST_EOS, 1, 4, 0, 10, 4000, 0, 5, 0).pack()
        io.send(1, eos, [], 0.0)
        assert io.pending_output() and sel.get_key(tx).events & selectors.EVENT_WRITE
        arr[:] = -1                         # the request ended: its buffer reused
        bufs.unregister(7)
        full["on"] = False
        io.flush(1)                         # the socket became writable
        assert not io.pending_output()
        got = [rx.recv(65536) for _ in range(11)]
    finally:
        rx.close()
        tx.close()
        sel.close()
    hs = [wire.parse_datagram(d, None) for d in got]
    assert [h.tag for h, _ in hs] == list(range(10)) + [10]
    assert hs[-1][0].kind == wire.MsgKind.MCAST_EOS
    payload = b"".join(bytes(p) for _, p in hs[:10])
    assert payload == want.tobytes()


@pytest.mark.parametrize("secret", [None, SECRET])
@pytest.mark.parametrize("order,gso,streams", [
    ("inorder", False, 1), ("inorder", True, 1), ("inorder", False, 2), ("shuffle", False, 1),
    ("shuffle", True, 2), ("dups", False, 1), ("dups", True, 2)])
def test_landing_in_place_is_exact_however_datagrams_come(secret, order, gso, streams):
    """Read straight into the predicted place: one stream in order lands (no copy of
    ours); interleaved, shuffled, duplicated or corrupted datagrams miss and are placed
    from where they fell; every buffer ends exact (a corrupted copy after its genuine
    datagram is a duplicate, or with a secret fails its MAC)."""
    exact, c = ft.landing_run(secret, order, gso, streams, seed=1)
    assert exact, c
    assert c["placed"] == 300 * streams
    if order == "inorder" and streams == 1:       # (GRO: the first buffer reads into a slot)
        assert c["landed"] > (50 if gso else 150), c


@pytest.mark.parametrize("secret", [None, SECRET])
def test_landing_holds_when_gro_buffers_vary_in_count(secret):
    """A paced sender's GSO groups (so the receiver's GRO buffers) hold varying counts of
    datagrams: each read is planned for a full buffer, so a fuller one than the last still
    lands (it used to spill into the slot, miss, and pause landing: one more copy each)."""
    exact, c = ft.landing_run(secret, "inorder", True, 1, groups=(1, 3, 2, 7, 1, 5, 4))
    assert exact, c
    if c["gro_buffers"] == 0:
        pytest.skip("the kernel does not coalesce UDP datagrams (GRO) on loopback")
    assert c["landed"] >= 270, c          # (the first buffers, before GRO is seen, do not)


@pytest.mark.slow
@pytest.mark.parametrize("secret", [None, SECRET])
def test_landing_exact_over_many_orders(secret):
    """The same with 8 seeds each: which datagrams land, miss or arrive in one batch
    varies; every buffer ends exact (arrival order decides between differing copies)."""
    for seed in range(8):
        for order, gso, streams in (("shuffle", False, 1), ("shuffle", True, 2),
                                    ("dups", False, 1), ("dups", True, 2)):
            exact, c = ft.landing_run(secret, order, gso, streams, seed=seed)
            assert exact, (seed, order, gso, streams, c)


# -- fuzzing (the reduced run; bench/fuzz.py --targets dgram runs 100,000) ---------------------

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FAST = settings(deadline=None, derandomize=True, database=None, max_examples=400,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("secret", [None, SECRET])
def test_fuzz_helper_parser_matches_the_reference_and_writes_nothing_else(secret):
    target = ft.DgramTarget(secret)
    corpus = target.corpus(random.Random(3))

    @st.composite
    def inputs(draw):
        data = bytearray(draw(st.sampled_from(corpus)))
        for pos, byte in draw(st.lists(st.tuples(st.integers(0, 120), st.integers(0, 255)),
                                       max_size=3)):
            if pos < len(data) and draw(st.booleans()):
                data[pos] = byte
        if draw(st.booleans()):
            data = data[:draw(st.integers(0, len(data) + 4))] + draw(st.binary(max_size=6))
        return bytes(data)

    @FAST
    @given(st.one_of(st.binary(max_size=100), inputs(), st.sampled_from(corpus)))
    def run(data):
        if target.inputs % 200 == 0:
            target.reset()
        target.check(data)
    run()
    assert target.outcomes.get("placed", 0) > 0, target.outcomes    # the fuzzer reached it


# -- the runtime with and without the helper ------------------------------------------------

@pytest.mark.parametrize("native,secret", [
    pytest.param("1", False, marks=pytest.mark.slow),     # (every other mcast test runs it)
    ("0", False),                                          # the Python path: no compiler
    pytest.param("1", True, marks=pytest.mark.slow)])
def test_runtime_multicast_exact_with_and_without_the_helper(native, secret):
    """Every multicast collective (selftest's mcast suite) on 3 local ranks, with the
    helper placing the chunks and without it (POLYCAST_TEST_HOOKS=dgram=0: the Python
    path), and with a job secret (the helper checks every MAC); each rank says which path
    it took (POLYCAST_DEBUG=INFO)."""
    env = dict(os.environ, POLYCAST_TEST_HOOKS=f"dgram={native}", POLYCAST_DEBUG="INFO")
    cmd = [sys.executable, "-m", "polycast.cli.main", "run", "-n", "3", "--timeout", "120"] + \
        (["--secret"] if secret else []) + ["-m", "polycast.tools.selftest", "--suite", "mcast"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.count("SELFTEST mcast OK") == 3 and "mcast=yes" in p.stdout
    path = "compiled path" if native == "1" else "Python path (test hook dgram=0)"
    assert (p.stdout + p.stderr).count(f"multicast datagrams: {path}") == 3, p.stderr[-3000:]


OFFLOAD_RANK = """
import json, numpy as np, polycast
comm = polycast.init(progress="offload")
P, r = comm.size, comm.rank
n = (4 << 20) // 4 // P * P
full = np.arange(n, dtype=np.float32)
recv, send = comm.empty(n, np.float32), comm.empty(n // P, np.float32)
send[:] = full.reshape(P, -1)[r]
for _ in range(3):
    comm.Allgather(send, recv, algorithm="mcast")
    assert np.array_equal(recv, full)
if r == 0:
    print("STATS " + json.dumps(comm._driver.offload_stats()["workers"]), flush=True)
polycast.finalize()
"""


@pytest.mark.slow
@pytest.mark.parametrize("nranks", [2, 4])
def test_offload_receive_workers_place_with_the_helper(tmp_path, nranks):
    """The offload process's receive worker reads and places with the helper: on one host
    (no loss) every local copy of every chunk of 3 allgathers is placed by it, the early
    ones after their stream opened (with 4 ranks, 3 local copies of each stream, held
    until all three opened), none recovered, nothing held dropped."""
    script = tmp_path / "rank.py"
    script.write_text(OFFLOAD_RANK)
    p = subprocess.run([sys.executable, "-m", "polycast.cli.main", "run", "-n", str(nranks),
                        "--timeout", "120", str(script)], capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    import json
    workers = json.loads(p.stdout.split("STATS ", 1)[1].splitlines()[0])
    w = workers[0]
    assert w["native"] is not None, workers
    # 3 calls; every rank receives the other ranks' shards (4 MiB / P), 60000 B chunks
    chunks = 3 * nranks * (nranks - 1) * -(-(4 << 20) // nranks // 60000)
    assert w["placed"] + w["recovered_placed"] == chunks, workers
    assert w["recovered_placed"] == 0 and w["held_dropped"] == 0, workers
