"""Runtime pieces in one process: environment detection, the rendezvous store, the shm
ring, the TCP link, multicast groups and the tuner's multicast fallback."""

from __future__ import annotations

import socket
import threading
import time
import warnings

import numpy as np
import pytest

from polycast.collectives import Collective
from polycast.errors import CollectiveTimeout, InvalidArgument
from polycast.runtime.bootstrap import env as envmod
from polycast.runtime.transport.mcast import group_for, open_group
from polycast.runtime.transport.shm import Ring
from polycast.runtime.bootstrap.store import PortInUse, StoreClient, StoreServer
from polycast.runtime.transport.tcp import TcpLink


# -- environment ------------------------------------------------------------------------
def test_missing_environment_names_the_variables():
    with pytest.raises(envmod.EnvironmentMissing) as exc:
        envmod.detect({})
    msg = str(exc.value)
    for var in ("POLYCAST_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        assert var in msg


def test_torchrun_environment_uses_master_port_plus_one():
    job = envmod.detect({"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2",
                         "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1",
                         "MASTER_PORT": "29500"})
    assert (job.rank, job.size, job.local_rank, job.launcher) == (2, 4, 2, "torchrun")
    assert (job.master_addr, job.master_port) == ("10.0.0.1", 29501)
    with pytest.raises(envmod.EnvironmentMissing, match="MASTER_PORT"):
        envmod.detect({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "x"})


def test_mpi_and_slurm_environments():
    ompi = envmod.detect({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3",
                          "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "3",
                          "OMPI_MCA_ess_base_jobid": "777"})
    assert (ompi.rank, ompi.size, ompi.launcher, ompi.master_addr) == (1, 3, "mpi", "127.0.0.1")
    again = envmod.detect({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "3",
                           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "3",
                           "OMPI_MCA_ess_base_jobid": "777"})
    assert again.master_port == ompi.master_port        # every rank derives the same port
    hydra = envmod.detect({"PMI_RANK": "0", "PMI_SIZE": "2", "MASTER_ADDR": "h",
                           "MASTER_PORT": "1234"})
    assert (hydra.size, hydra.master_addr, hydra.master_port) == (2, "h", 1234)
    slurm = envmod.detect({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
                           "SLURM_NNODES": "2", "MASTER_ADDR": "node1", "MASTER_PORT": "4000"})
    assert (slurm.rank, slurm.size, slurm.local_rank, slurm.launcher) == (5, 8, 1, "slurm")
    with pytest.raises(envmod.EnvironmentMissing, match="MASTER_ADDR"):
        envmod.detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_NNODES": "2",
                       "SLURM_JOB_ID": "1"})


def test_environment_rejects_bad_values():
    with pytest.raises(envmod.EnvironmentMissing, match="out of range"):
        envmod.detect({"POLYCAST_RANK": "4", "POLYCAST_SIZE": "4",
                       "POLYCAST_MASTER_ADDR": "127.0.0.1", "POLYCAST_MASTER_PORT": "1"})
    with pytest.raises(InvalidArgument, match="POLYCAST_TIMEOUT"):
        envmod.timeout_from_env({"POLYCAST_TIMEOUT": "-3"})


# -- rendezvous store -------------------------------------------------------------------
def test_store_set_get_wait_add():
    server = StoreServer("127.0.0.1", 0)
    try:
        a = StoreClient("127.0.0.1", server.port, timeout_seconds=5)
        b = StoreClient("127.0.0.1", server.port, timeout_seconds=5)
        assert a.get("k") is None
        got = []
        t = threading.Thread(target=lambda: got.append(b.wait("k", 5)))
        t.start()
        time.sleep(0.05)
        a.set("k", b"value")
        t.join(5)
        assert got == [b"value"] and a.get("k") == b"value"
        assert [a.add("n"), b.add("n", 2)] == [1, 3]
        a.close()
        b.close()
    finally:
        server.close()


def test_store_wait_is_bounded_and_names_the_key():
    server = StoreServer("127.0.0.1", 0)
    try:
        c = StoreClient("127.0.0.1", server.port, timeout_seconds=5)
        t0 = time.monotonic()
        with pytest.raises(CollectiveTimeout, match="never-set"):
            c.wait("never-set", timeout=0.3)
        assert time.monotonic() - t0 < 2
    finally:
        server.close()


def test_store_unreachable_and_port_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(CollectiveTimeout, match="MASTER_ADDR"):
            StoreClient("127.0.0.1", port, timeout_seconds=0.5)   # bound, not listening
        assert time.monotonic() - t0 < 3
        s.listen()
        with pytest.raises(PortInUse, match="in use"):
            StoreServer("127.0.0.1", port)


# -- shared-memory ring -----------------------------------------------------------------
def test_ring_roundtrip_with_pieces_and_pinning(tmp_path):
    path = str(tmp_path / "ring")
    reader = Ring.create(path, 1 << 16)
    writer = Ring.attach(path, 1 << 16)
    reader.unlink()
    rng = np.random.default_rng(3)
    msgs = [rng.integers(0, 255, int(n), dtype=np.uint8) for n in rng.integers(0, 50000, 120)]
    got, held, sent = [], [], 0
    for step in range(20000):
        while sent < len(msgs) and len(writer._out) < 4:
            m = msgs[sent]
            writer.enqueue(3, b"h%02d" % (sent % 100), [m[:len(m) // 3], m[len(m) // 3:]],
                           len(m), sent)
            sent += 1
        writer.flush()
        frames = []
        reader.poll(frames)
        for hdr_len, header, payload, _key in frames:
            assert hdr_len == 3 and header == b"h%02d" % (len(got) % 100)
            got.append(bytes(payload) if payload is not None else b"")
            held.append(payload)           # the engine may hold payloads a while
        frames = payload = None
        if step % 3 == 0:
            held.clear()                   # ... then let go: the frames go back
        if len(got) == len(msgs):
            break
    assert [g for g in got] == [m.tobytes() for m in msgs]


def _futex_ring_pair(tmp_path):
    """A ring's reader and writer ends (skips where futex wake-ups are unavailable)."""
    from polycast.runtime.transport import futex
    if not futex.available():
        pytest.skip(f"futex wake-ups unavailable: {futex.unavailable_reason()}")
    path = str(tmp_path / "ring")
    reader = Ring.create(path, 1 << 16)
    writer = Ring.attach(path, 1 << 16)
    reader.unlink()
    return reader, writer


def test_ring_futex_bells_wake_a_sleeping_reader_and_a_blocked_writer(tmp_path):
    """The counters a sleeper waits on: a flush that wrote bumps the data counter and asks
    for a futex wake when the reader sleeps on it; freeing space bumps the space counter.
    A thread sleeping on them (futex_waitv) wakes on the writer's FUTEX_WAKE."""
    import threading

    from polycast.runtime.transport import futex
    from polycast.runtime.transport.shm import SLEEP_FUTEX, SLEEP_SELECT
    reader, writer = _futex_ring_pair(tmp_path)
    ws = futex.WaitSet([(reader.data_bell_addr, False), (writer.space_bell_addr, False)])
    d0, s0 = reader.data_bell(), writer.space_bell()
    reader.set_sleeping(SLEEP_FUTEX)
    woke = threading.Event()

    def sleeper():
        ws.wait([d0, s0], 30.0)
        woke.set()
    t = threading.Thread(target=sleeper)
    t.start()
    assert not woke.wait(0.2)                      # nothing happened yet: it sleeps
    writer.enqueue(3, b"hdr", [np.ones(100, np.uint8)], 100, "tok")
    done, bell = writer.flush()
    assert done == ["tok"] and bell == SLEEP_FUTEX and reader.data_bell() == d0 + 1
    futex.wake(writer.data_bell_addr)              # the writer's mapping, the same word
    assert woke.wait(10)
    t.join()
    reader.set_sleeping(SLEEP_SELECT)
    writer.enqueue(3, b"hdr", [], 0, None)
    assert writer.flush()[1] == SLEEP_SELECT       # a select sleeper wants a doorbell frame
    reader.set_sleeping(0)
    frames = []
    reader.poll(frames)
    assert len(frames) == 2 and writer.space_bell() != s0       # space freed: bumped
    writer.close()
    reader.close()




def test_blocked_writer_waits_on_the_space_counter_it_saw_when_the_ring_was_full(tmp_path):
    """The writer found the ring full; the reader then frees space (bumping the counter,
    its wake-up coming before the writer sleeps). The value the writer sleeps on is the
    one from before the re-check, so the wait ends at once rather than at its timeout
    (the lost wake-up that cost 16 MiB broadcasts ~50 ms per call)."""
    path = str(tmp_path / "ring")
    reader = Ring.create(path, 1 << 16)
    writer = Ring.attach(path, 1 << 16)
    reader.unlink()
    assert writer.space_seen is None and writer.space_wait_value() == writer.space_bell()
    for i in range(8):
        writer.enqueue(3, b"hdr", [np.full(12000, i, np.uint8)], 12000, i)
    done, _ = writer.flush()
    assert writer.want_write and len(done) < 8          # full: the rest waits
    seen = writer.space_wait_value()
    assert seen == writer.space_seen
    frames = []
    reader.poll(frames)                                 # copies out and frees space
    frames.clear()
    assert writer.space_bell() != seen                  # a sleeper would not sleep
    assert writer.space_wait_value() == seen            # still blocked: the stale value
    while writer.want_write:
        writer.flush()
        reader.poll(frames)
    assert writer.space_seen is None
    writer.close()
    reader.close()


@pytest.mark.parametrize("how", ["platform", "no-syscall"])
def test_futex_unavailable_says_why_and_the_driver_keeps_doorbells(monkeypatch, how):
    """Off Linux or with no syscall() in the C library the probe answers False with a
    reason (and the driver then sleeps in select on doorbells, as under the futex=0 test
    hook)."""
    import ctypes

    from polycast.runtime.transport import futex
    monkeypatch.setattr(futex, "_syscall", None)
    monkeypatch.setattr(futex, "_why_not", None)
    if how == "platform":
        monkeypatch.setattr(futex.sys, "platform", "darwin")
    else:
        def no_libc(*a, **k):
            raise OSError("no C library here")
        monkeypatch.setattr(ctypes, "CDLL", no_libc)
    assert futex.available() is False
    assert futex.unavailable_reason()


# -- TCP link ---------------------------------------------------------------------------
def test_tcp_links_exchange_large_messages_both_ways_without_blocking():
    a, b = socket.socketpair()
    la, lb = TcpLink(a, 1), TcpLink(b, 0)
    big = np.arange(3 << 20, dtype=np.uint8)          # larger than both socket buffers
    for link in (la, lb):
        link.enqueue(44, b"H" * 44, [memoryview(big)], big.nbytes, "big")
        link.enqueue(44, b"S" * 44, [b"small"], 5, "small")
    got = {id(la): [], id(lb): []}
    done = []
    for _ in range(20000):
        for link in (la, lb):
            done += link.flush()                       # never blocks
            link.read(got[id(link)])
        if all(len(v) == 2 for v in got.values()):
            break
    for frames in got.values():
        (h1, hdr1, p1), (h2, hdr2, p2) = frames
        assert h1 == 44 and hdr1 == b"H" * 44 and np.array_equal(np.frombuffer(p1, np.uint8), big)
        assert hdr2 == b"S" * 44 and bytes(p2) == b"small"
    assert sorted(done) == ["big", "big", "small", "small"]
    a.close()
    b.close()


def _tcp_pair():
    """Two TcpLinks over a loopback TCP connection (lazy frames need AF_INET)."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    a = socket.create_connection(lsock.getsockname())
    b, _ = lsock.accept()
    lsock.close()
    return TcpLink(a, 1), TcpLink(b, 0)


def _first_frames(link, tries: int = 100) -> list:
    """Read ``link`` until it hands over a frame (bounded)."""
    frames = []
    for _ in range(tries):
        link.read(frames)
        if frames:
            break
        time.sleep(0.01)
    return frames


def test_tcp_lazy_payload_is_read_into_its_destination_while_the_read_pumps_output():
    """A DATA larger than the socket buffers: the receiver gets a SocketPayload at its header
    and reads it straight into the destination; while it waits for bytes it calls the link's
    pump, which here is the only thing that makes the sender write the rest."""
    from polycast.runtime.transport.tcp import SocketPayload
    la, lb = _tcp_pair()
    big = (np.arange(24 << 20, dtype=np.uint32) % 251).astype(np.uint8)
    la.enqueue(44, b"H" * 44, [memoryview(big)], big.nbytes, "big", lazy_ok=True)
    la.enqueue(44, b"S" * 44, [b"small"], 5, "small")
    done = la.flush()                       # the first part: what the socket takes now
    assert not done and la.want_write
    frames = _first_frames(lb)
    (hdr_len, header, payload), = frames
    assert type(payload) is SocketPayload and hdr_len == 44 and header == b"H" * 44
    pumps = []

    def pump():
        pumps.append(1)
        done.extend(la.flush())
        return [la.sock] if la.want_write else []
    lb.pump = pump
    dst = np.zeros(big.nbytes, np.uint8)
    half = big.nbytes // 2                  # two runs, as a strided region would be
    payload.read_into([(dst.ctypes.data, half), (dst.ctypes.data + half, big.nbytes - half)])
    payload.finish()
    assert np.array_equal(dst, big) and pumps and lb.lazy_frames == 1
    for _ in range(100):                    # the next frame reads normally
        done.extend(la.flush())
        lb.read(frames)
        if len(frames) == 2:
            break
        time.sleep(0.01)
    assert frames[1][1] == b"S" * 44 and bytes(frames[1][2]) == b"small"
    assert done == ["big", "small"]
    la.sock.close()
    lb.sock.close()


def test_tcp_lazy_payload_whose_sender_stalls_fails_within_the_stall_bound():
    """A sender that stops in the middle of a large DATA (SIGSTOP): the blocked read ends
    after ``stall_s`` with PeerLost naming the peer, never waits forever."""
    from polycast.errors import PeerLost
    la, lb = _tcp_pair()
    big = np.ones(24 << 20, np.uint8)
    la.enqueue(44, b"H" * 44, [memoryview(big)], big.nbytes, "big", lazy_ok=True)
    la.flush()                              # part of it; nobody flushes the rest
    frames = _first_frames(lb)
    payload = frames[0][2]
    lb.stall_s = 0.3
    dst = np.zeros(big.nbytes, np.uint8)
    t0 = time.monotonic()
    with pytest.raises(PeerLost, match="no data for 0.3 s"):
        payload.read_into([(dst.ctypes.data, big.nbytes)])
    assert 0.25 < time.monotonic() - t0 < 5
    la.sock.close()
    lb.sock.close()


# -- multicast --------------------------------------------------------------------------
def test_multicast_group_is_derived_and_joinable():
    g1, g2 = group_for("job", 0), group_for("job", 1)
    assert g1 != g2 and g1[0].startswith("239.255.") and g1 == group_for("job", 0)
    s1, grp = open_group("job-t", 5, single_host=True)
    s2, _ = open_group("job-t", 5, single_host=True)
    try:
        s1.sendto(b"hello", grp)
        deadline = time.monotonic() + 2
        data = None
        while time.monotonic() < deadline and data is None:
            try:
                data = s2.recv(100)
            except BlockingIOError:
                time.sleep(0.005)
        assert data == b"hello"
    finally:
        s1.close()
        s2.close()


def test_multicast_unavailable_falls_back_with_a_warning():
    from polycast.comm import Comm

    class FakeDriver:
        rank = 0
    comm = Comm(FakeDriver(), 0, [0, 1, 2, 3], 60.0, mcast_error="cannot join (test)")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        algo = comm.choose_algorithm(Collective.ALLGATHER, 1 << 20, "mcast")
    assert algo != "mcast" and "mcast" not in algo
    assert any("multicast" in str(x.message) and algo in str(x.message) for x in w)
    # and auto never picks multicast
    assert "mcast" not in comm.choose_algorithm(Collective.BROADCAST, 64 << 20, None)


def test_algorithm_from_environment_and_auto_rules(monkeypatch, tmp_path):
    from polycast.comm import Comm

    class FakeDriver:
        rank = 1
    monkeypatch.setenv("POLYCAST_PROFILE", str(tmp_path / "none.json"))   # built-in model
    monkeypatch.setenv("POLYCAST_ALLGATHER_ALGO", "bruck")
    comm = Comm(FakeDriver(), 0, [0, 1, 2, 3], 60.0)
    assert comm.choose_algorithm(Collective.ALLGATHER, 1 << 20, None) == "bruck"
    assert comm.choose_algorithm(Collective.ALLGATHER, 1 << 20, "ring") == "ring"  # call wins
    monkeypatch.delenv("POLYCAST_ALLGATHER_ALGO")
    # read once, when the communicator was made: it keeps its setting; a new one reads anew
    assert comm.choose_algorithm(Collective.ALLGATHER, 1 << 20, None) == "bruck"
    comm = Comm(FakeDriver(), 0, [0, 1, 2, 3], 60.0)
    # auto is the planner's choice: a few message hops for 8 bytes, bandwidth-optimal
    # traffic (2(P-1)/P S per rank) for 16 MiB.
    small = comm.choose_algorithm(Collective.ALLREDUCE, 8, None)
    assert small == comm.plan("allreduce", 8, symm=False).algorithm
    assert small in ("recdoubling", "rabenseifner", "binomial", "dbtree")
    assert comm.choose_algorithm(Collective.ALLREDUCE, 16 << 20, None) in (
        "ring", "rabenseifner", "mcast")
    monkeypatch.setenv("POLYCAST_ALLREDUCE_ALGO", "nonsense")
    comm = Comm(FakeDriver(), 0, [0, 1, 2, 3], 60.0)
    with pytest.raises(InvalidArgument, match="ring"):
        comm.choose_algorithm(Collective.ALLREDUCE, 8, None)


def test_init_with_partial_explicit_job_is_rejected():
    import polycast
    with pytest.raises(InvalidArgument, match="master_port"):
        polycast.init(rank=0, size=2)


def test_init_explicit_single_rank():
    import numpy as np
    import polycast
    from polycast.tools.launch import free_port
    comm = polycast.init(rank=0, size=1, master_addr="127.0.0.1", master_port=free_port(),
                         timeout=10)
    try:
        assert (comm.rank, comm.size) == (0, 1)
        x = np.arange(5, dtype=np.float64)
        y = np.empty_like(x)
        comm.Allreduce(x, y)
        assert np.array_equal(x, y)
        assert comm.allgather("me") == ["me"]
    finally:
        polycast.finalize()


def test_shm_rings_are_refused_on_cpus_without_total_store_order(monkeypatch):
    from polycast.runtime.transport import shm
    monkeypatch.setattr(shm.platform, "machine", lambda: "aarch64")
    assert not shm.shm_available()
    assert "store ordering" in shm.shm_unavailable_reason()
    monkeypatch.setattr(shm.platform, "machine", lambda: "x86_64")
    assert shm.shm_unavailable_reason() in (None, f"{shm.SHM_DIR} is not a writable directory")


def test_auto_symm_is_not_offered_without_total_store_order(monkeypatch):
    from polycast.runtime.transport import shm
    from polycast.dispatch import routing

    class _World:
        single_host = True

    class _Comm:
        _driver = type("D", (), {"world": _World()})()

    def dispatch():
        return type("Dispatch", (), {"comm": _Comm(), "one_host": None})()
    assert routing.members_on_one_host(dispatch())
    monkeypatch.setattr(shm.platform, "machine", lambda: "aarch64")
    assert not routing.members_on_one_host(dispatch())


def test_datagram_size_follows_the_interface_mtu(monkeypatch):
    from polycast.engine.wire import header_nbytes
    from polycast.runtime.transport.mcast import datagram_payload_nbytes
    assert datagram_payload_nbytes("job", True, None) == 60000
    lo = "127.0.0.1"                                    # POLYCAST_MCAST_IF: lo, a 64 KiB MTU
    with open("/sys/class/net/lo/mtu") as fh:
        lo_mtu = int(fh.read())
    want = min(65000, lo_mtu - 28 - header_nbytes(None))
    assert datagram_payload_nbytes("job", False, None, lo) == want
    assert datagram_payload_nbytes("job", False, b"key", lo) == min(
        65000, lo_mtu - 28 - header_nbytes(b"key"))
    nowhere = "192.0.2.1"                               # no such interface here
    assert datagram_payload_nbytes("job", False, None, nowhere) == \
        1500 - 28 - header_nbytes(None)


def test_a_driving_thread_does_not_sleep_on_a_request_already_done():
    """Progress._block looks at the driven request after reading what it sleeps on, so a
    request the progress thread finished meanwhile ends the sleep at once; and a progress-
    thread round that finishes a request while a user thread drives wakes the drivers."""
    import time

    import numpy as np
    import polycast
    from polycast.runtime.driver.request import Request
    from polycast.tools.launch import free_port
    comm = polycast.init(rank=0, size=1, master_addr="127.0.0.1", master_port=free_port(),
                         timeout=10)
    try:
        d = comm._driver
        pr = d.progress
        done = Request(12345)
        done._done = True
        t = time.monotonic()
        pr._block(2.0, done)
        assert time.monotonic() - t < 1.0
        # A completed call counts as finished (what the wake-up keys on).
        before = d.runner.finished
        x = np.ones(3, np.float32)
        comm.Allreduce(x, np.empty_like(x), algorithm="recdoubling")
        assert d.runner.finished == before + 1
        # A round that finished something while a user thread drives: the drivers' wake
        # counter moves.
        real_round = pr.round

        def finishing_round():
            d.runner.finished += 1
            return real_round()
        with pr.lock:
            pr.round = finishing_round
            pr._driving += 1
            try:
                wakes = []
                real_wake = pr._wake_futex_sleepers
                pr._wake_futex_sleepers = lambda: (wakes.append(1), real_wake())
                pr._round_waking_drivers()
                assert wakes == [1]
                pr._driving -= 1
                pr._round_waking_drivers()          # nobody drives: no wake-up
                assert wakes == [1]
                pr._driving += 1
            finally:
                pr._driving -= 1
                pr.round = real_round
                pr._wake_futex_sleepers = real_wake
    finally:
        polycast.finalize()


def test_a_ring_wake_up_wakes_every_sleeper_of_the_reader(tmp_path):
    """The reader's progress thread (carrying an overlapped request) and a user thread
    driving a call (Barrier, Wait) can both sleep on a ring's data counter. The writer's
    wake-up must reach both: woken alone, the progress thread could take the frame and
    finish the driver's call while the driver slept on to its 50 ms bound (seen as every
    other Barrier after an overlapped 64 MiB Iallreduce taking 50 ms)."""
    import threading
    from types import SimpleNamespace

    from polycast.runtime.transport import futex
    from polycast.runtime.driver.peers import PeerIO
    from polycast.runtime.transport.shm import SLEEP_FUTEX
    reader, writer = _futex_ring_pair(tmp_path)
    d0 = reader.data_bell()
    reader.set_sleeping(SLEEP_FUTEX)
    woke = [threading.Event(), threading.Event()]

    def sleeper(ev):
        futex.WaitSet([(reader.data_bell_addr, False)]).wait([d0], 30.0)
        ev.set()
    threads = [threading.Thread(target=sleeper, args=(ev,)) for ev in woke]
    for t in threads:
        t.start()
    assert not woke[0].wait(0.2) and not woke[1].is_set()      # both asleep
    writer.enqueue(3, b"hdr", [np.ones(100, np.uint8)], 100, "tok")
    assert writer.flush()[1] == SLEEP_FUTEX
    # The counter moved after they went to sleep: only a FUTEX_WAKE ends their sleep.
    PeerIO._wake_reader(SimpleNamespace(futex=True), 1, SimpleNamespace(ring_out=writer),
                        SLEEP_FUTEX)
    assert woke[0].wait(10) and woke[1].wait(10), "a sleeper missed the wake-up"
    for t in threads:
        t.join()
    writer.close()
    reader.close()
