"""Single-copy messages between processes on one host (polycast.runtime.transport.cma): the
process_vm_readv wrapper, the payload object the engine sees, the refusals, a writer that
died, and whole collectives with single-copy forced on every message and forced off."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from polycast import config
from polycast.engine.early import own
from polycast.errors import InvalidArgument, PeerLost
from polycast.runtime.transport import cma

from test_runtime_helpers import selftest

needs_cma = pytest.mark.skipif(cma.disabled_reason() is not None or
                               cma.probe(os.getpid(), cma.probe_info()) is not None,
                               reason=f"process_vm_readv unusable here: "
                                      f"{cma.disabled_reason() or 'probe of self refused'}")


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@needs_cma
def test_read_own_memory_in_pieces():
    src = np.arange(100_000, dtype=np.uint8)
    dst = np.zeros(100_000, np.uint8)
    # two local runs from one remote range, as a Deliver into a strided region does
    cma.read(os.getpid(), [(_addr(dst), 30_000), (_addr(dst) + 50_000, 50_000)],
             [(_addr(src), 80_000)])
    assert (dst[:30_000] == src[:30_000]).all()
    assert (dst[50_000:] == src[30_000:80_000]).all()
    assert not dst[30_000:50_000].any()


@needs_cma
def test_write_into_a_live_process_and_refused_into_a_dead_one():
    """cma.write (process_vm_writev, the broadcast root's half of the copying): the bytes
    land in the other process, a range at a time; a peer gone is ESRCH, nothing else."""
    nbytes = 3 * 4096 + 5
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, ctypes\n"
         f"b = ctypes.create_string_buffer({nbytes})\n"
         "print(ctypes.addressof(b), flush=True)\nsys.stdin.readline()\n"
         "print(b.raw.hex(), flush=True)\nsys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        addr = int(child.stdout.readline())
        src = (np.arange(nbytes) % 251 + 1).astype(np.uint8)
        # two local ranges into one remote range, skipping the remote's first 5 bytes
        cma.write(child.pid, [(_addr(src), 4096), (_addr(src) + 4096, nbytes - 4101)],
                  [(addr + 5, nbytes - 5)])
        child.stdin.write("\n")
        child.stdin.flush()
        got = np.frombuffer(bytes.fromhex(child.stdout.readline().strip()), np.uint8)
        assert not got[:5].any()
        assert (got[5:] == src[:nbytes - 5]).all()
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    with pytest.raises(OSError) as info:
        cma.write(child.pid, [(_addr(src), 16)], [(addr, 16)])
    assert info.value.errno == errno.ESRCH


@needs_cma
def test_remote_payload_deliver_reduce_and_keep():
    from polycast.memory import Buffers
    from polycast.engine.actions import Region
    src = np.arange(1000, dtype=np.float32)
    bufs = Buffers()
    recv = np.ones(2000, np.float32)
    bufs.register_arrays(7, recv=recv)
    p = cma.RemotePayload(1, os.getpid(), _addr(src), src.nbytes)
    bufs.deliver(Region(7, "recv", ((0, 500), (1500, 2000)), 4000), p, False)
    assert (recv[:500] == src[:500]).all() and (recv[1500:] == src[500:]).all()
    assert (recv[500:1500] == 1).all()
    assert p.used
    p.finish()                              # read already: nothing more, released
    assert p.closed and p.local is None
    with pytest.raises(PeerLost, match="after it was released"):
        p.read_into([(_addr(recv), 4)])
    # a reducing delivery (reads into scratch, then combines)
    bufs._reqs[7].ufunc = np.add
    q = cma.RemotePayload(1, os.getpid(), _addr(src), src.nbytes)
    recv[:] = 1
    bufs.deliver(Region(7, "recv", ((0, 1000),), 4000), q, True)
    assert (recv[:1000] == src + 1).all()
    # kept for later (the engine's own()): a copy of its own, usable after finish
    k = cma.RemotePayload(1, os.getpid(), _addr(src), src.nbytes)
    kept = own(k)
    k.finish()
    src[:] = 0                              # the writer reuses its buffer
    assert (np.frombuffer(kept, np.float32) == np.arange(1000)).all()
    # never read by anyone (a dropped frame): finish reads it, so nothing can go stale
    d = cma.RemotePayload(1, os.getpid(), _addr(src), src.nbytes)
    d.finish()
    assert d.local is not None and len(d) == 4000


@needs_cma
def test_dead_writer_is_a_clear_peer_lost():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()                                # gone and reaped: its pid names no process
    buf = np.zeros(16, np.uint8)
    rp = cma.RemotePayload(3, p.pid, _addr(buf), 16)
    with pytest.raises(PeerLost) as info:
        rp.read_into([(_addr(buf), 16)])
    assert info.value.rank == 3
    assert "ESRCH" in str(info.value) and str(p.pid) in str(info.value)
    with pytest.raises(PeerLost):
        rp.finish()
    assert cma.probe(p.pid, cma.probe_info()) is not None


def test_refusals():
    assert cma.disabled_reason(None, enabled=False) == "the cma=0 test hook"
    if cma.disabled_reason() is None:
        assert "secret" in cma.disabled_reason(b"k")
    assert cma.probe(0, cma.probe_info()) is not None          # another pid namespace
    assert cma.probe(os.getpid(), None) is not None            # nothing published
    wrong = [cma.probe_info()[0], "00" * 8]
    if cma.disabled_reason() is None:
        assert cma.probe(os.getpid(), wrong) == "process_vm_readv read the wrong bytes"
    assert config.load({}).cma_min_nbytes == 512 << 10
    with pytest.raises(InvalidArgument, match="POLYCAST_CMA_MIN_NBYTES='garbage'"):
        config.load({"POLYCAST_CMA_MIN_NBYTES": "garbage"})   # once silently the default


OK = re.compile(r"SELFTEST all OK (\d+) checks .* transports=shm .* single_copy=(\d+)/(\d+)")


@pytest.mark.parametrize("forced", ["on", "off"])
def test_every_algorithm_single_copy_forced(forced):
    """Every collective and algorithm, exact, on 3 shm ranks: with every DATA payload
    single-copy (threshold 1 byte), and with the cma=0 test hook (the rings carry all)."""
    env = {"POLYCAST_TRANSPORT": "shm", "POLYCAST_SYMM": "0"}
    if forced == "on":
        env["POLYCAST_CMA_MIN_NBYTES"] = "1"
    else:
        env["POLYCAST_TEST_HOOKS"] = "cma=0"
    results = selftest(3, "all", env=env, timeout=240)
    for r in results:
        m = OK.search(r.out)
        assert r.returncode == 0 and m, (
            f"rank {r.rank} exit {r.returncode}\n{r.out[-3000:]}\n{r.err[-3000:]}")
        sent, read = int(m.group(2)), int(m.group(3))
        if forced == "off":
            assert sent == read == 0
        elif cma.disabled_reason() is None:
            assert sent > 100 and read > 100, m.group(0)


@needs_cma
def test_writer_dead_before_its_descriptor_is_read_marks_it_lost():
    """The transport's side: a descriptor whose writer is gone makes the peer lost with
    the reason (no hang, no read of anything), and nothing is acknowledged to it."""
    import selectors
    import socket

    from polycast.runtime.driver.peers import PeerIO
    from polycast.runtime.transport.tcp import TcpLink
    from polycast.runtime.bootstrap.world import Peer, World

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    a, b = socket.socketpair()
    sel = selectors.DefaultSelector()
    world = World(0, 2, "t", True, 5.0)
    world.peers[1] = Peer(1, TcpLink(a, 1), None, None, True, p.pid)
    frames, lost = [], []
    io = PeerIO(world, sel, lambda src, h, pl: frames.append(pl), lambda toks: None,
                lambda r, why: lost.append((r, why)))
    try:
        buf = np.zeros(64, np.uint8)
        io._single_copy_frame(1, cma.DESC.pack(1, _addr(buf), 64) + b"HDR")
        assert len(frames) == 1 and isinstance(frames[0], cma.RemotePayload)
        assert lost and lost[0][0] == 1 and "ESRCH" in lost[0][1], lost
        assert io.down(1) and io.cma_read == 0 and 1 not in io._cma_acks
    finally:
        io.close()
        b.close()
        sel.close()


LARGE = re.compile(r"LARGE OK single_copy=(\d+)/(\d+) tcp_lazy=(\d+) tcp_streamed=(\d+)")


@pytest.mark.parametrize("transport,cma_env", [("shm", "1"), ("shm", "0"), ("tcp", "1")])
def test_large_messages_exact(transport, cma_env):
    """100 KiB .. 12 MiB collectives on 3 ranks, exact: over shm with single-copy (and with
    it off: the rings carry every byte), and over TCP, where large DATA payloads that have
    arrived are received straight into their destination (tcp.SocketPayload)."""
    from test_runtime_helpers import spawn_ranks
    results = spawn_ranks(3, ["tests/large_exact.py"], timeout=240,
                          env={"POLYCAST_TRANSPORT": transport, "POLYCAST_SYMM": "0",
                               "POLYCAST_TEST_HOOKS": f"cma={cma_env}"})
    lazy_total = 0
    for r in results:
        m = LARGE.search(r.out)
        assert r.returncode == 0 and m, (
            f"rank {r.rank} exit {r.returncode}\n{r.out[-3000:]}\n{r.err[-3000:]}")
        single, lazy = int(m.group(1)), int(m.group(3))
        lazy_total += lazy
        if transport == "tcp":
            assert single == 0, m.group(0)
        elif cma_env == "0" or cma.disabled_reason() is not None:
            assert single == 0 and lazy == 0, m.group(0)
        else:
            assert single > 0, m.group(0)
    if transport == "tcp":
        # payloads that had all arrived when their header was read went straight to their
        # destination (which ones did depends on timing; some always do: 100 KiB ones)
        assert lazy_total > 0


@needs_cma
@pytest.mark.parametrize("dtype", [np.int32, np.float64])
@pytest.mark.parametrize("op", ["sum", "max", "prod"])
def test_single_copy_reduce_in_pieces_matches_numpy(op, dtype, monkeypatch):
    """A reducing delivery of a single-copy payload reads it a piece at a time into the
    per-thread scratch and combines each piece at once: the same result as numpy, for
    payloads below, at and above the piece size, sizes not a multiple of it, and regions
    of several runs whose boundaries fall inside pieces."""
    from polycast import memory, ops
    from polycast.engine.actions import Region
    monkeypatch.setattr(memory, "REDUCE_PIECE_NBYTES", 4096)       # many pieces, small sizes
    combine = ops.get(op).combine
    ref = {"sum": np.add, "max": np.maximum, "prod": np.multiply}[op]
    per_piece = 4096 // np.dtype(dtype).itemsize
    rng = np.random.default_rng(9)
    for nelems in (1, per_piece - 1, per_piece, per_piece + 1, 3 * per_piece + 7, 10_001):
        cut = nelems // 3
        for runs in (((0, nelems),), ((0, cut), (cut + 5, nelems + 5))):
            src = rng.integers(1, 4, nelems).astype(dtype)
            recv = rng.integers(1, 4, nelems + 5).astype(dtype)
            want = recv.copy()
            pos = 0
            for a, b in runs:
                want[a:b] = ref(recv[a:b], src[pos:pos + b - a])
                pos += b - a
            bufs = memory.Buffers()
            bufs.register_arrays(7, recv=recv)
            bufs._reqs[7].ufunc = combine
            p = cma.RemotePayload(1, os.getpid(), _addr(src), src.nbytes)
            bufs.deliver(Region(7, "recv", runs, src.nbytes), p, True)
            assert (recv == want).all(), (op, dtype, nelems, runs)
            assert p.used
            p.finish()
            assert p.local is None                  # read once, nothing kept
    # and at the real piece size: a payload of a few pieces plus an odd tail
    monkeypatch.undo()
    src = np.arange(3 * memory.REDUCE_PIECE_NBYTES // 8 + 3, dtype=np.float64)
    recv = np.full(src.size, 0.5)
    bufs = memory.Buffers()
    bufs.register_arrays(8, recv=recv)
    bufs._reqs[8].ufunc = ops.get("sum").combine
    p = cma.RemotePayload(1, os.getpid(), _addr(src), src.nbytes)
    bufs.deliver(Region(8, "recv", ((0, src.size),), src.nbytes), p, True)
    assert (recv == src + 0.5).all()


@needs_cma
def test_writer_dying_between_pieces_of_a_reduce_is_peer_lost(monkeypatch):
    """The writer exits after the first piece of a reducing delivery was read: the next
    piece's process_vm_readv fails (ESRCH) and the delivery raises PeerLost naming it."""
    from polycast import memory
    from polycast.engine.actions import Region
    nbytes = 3 * memory.REDUCE_PIECE_NBYTES
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time, ctypes\n"
         f"b = ctypes.create_string_buffer({nbytes})\n"
         "print(ctypes.addressof(b), flush=True)\nsys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        addr = int(child.stdout.readline())
        real_read, calls = cma.read, []

        def read_then_end_writer(pid, local, remote):
            real_read(pid, local, remote)
            calls.append(pid)
            if len(calls) == 1:                 # the first piece arrived: the writer exits
                child.stdin.close()
                child.wait(timeout=30)
        monkeypatch.setattr(cma, "read", read_then_end_writer)
        recv = np.ones(nbytes, np.uint8)
        bufs = memory.Buffers()
        bufs.register_arrays(7, recv=recv)
        bufs._reqs[7].ufunc = np.add
        p = cma.RemotePayload(4, child.pid, addr, nbytes)
        with pytest.raises(PeerLost) as info:
            bufs.deliver(Region(7, "recv", ((0, nbytes),), nbytes), p, True)
        assert info.value.rank == 4 and "ESRCH" in str(info.value)
        assert len(calls) == 1                  # the second piece's read failed
        with pytest.raises(PeerLost):
            p.finish()
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)


@needs_cma
def test_symm_single_copy_to_or_from_a_dead_rank_is_peer_lost():
    """The symm single-copy forms (a broadcast's root writing into a reader, a reader
    reading a root) map a peer that is gone (ESRCH) to PeerLost naming its rank, and
    mark the barrier broken so the other ranks' next wait fails too."""
    from types import SimpleNamespace
    from polycast.runtime.symm import single
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()                                # gone and reaped: its pid names no process
    buf = np.zeros(64, np.uint8)
    for write, doing in ((True, "writing into"), (False, "reading")):
        st = SimpleNamespace(rank=0, pids=[os.getpid(), p.pid],
                             bar=SimpleNamespace(broken=None))
        with pytest.raises(PeerLost) as info:
            single._read_peer(st, 1, buf, _addr(buf), "symm bcast of 64 x uint8", write)
        assert info.value.rank == 1
        assert f"rank 1 exited while {doing} its array" in str(info.value)
        assert st.bar.broken and "PeerLost" in st.bar.broken
