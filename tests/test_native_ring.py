"""The shm rings' compiled hot path (polycast/runtime/transport/_ring.c) and its pure-Python fallback:
the same wire layout, so a writer of either kind and a reader of either kind interoperate
(in one process here, and across processes in a 3-rank job with one fallback rank).
Tests needing the compiled helper are skipped, saying why, where it was not built."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

from polycast.runtime.transport import futex, native
from polycast.runtime.transport.frames import KIND_CMA, KIND_CMA_DONE
from polycast.runtime.transport.shm import COPY_OUT_NBYTES, SLEEP_FUTEX, Ring
from test_runtime_helpers import spawn_ranks

needs_native = pytest.mark.skipif(native.ring is None,
                                  reason=f"compiled ring helper not in use: {native.why_not}")
KINDS = [pytest.param(w, r, id=f"{w}-writer-{r}-reader",
                      marks=[needs_native] if "native" in (w, r) else [])
         for w in ("native", "python") for r in ("native", "python")]


def _pair(tmp_path, writer: str, reader: str, capacity: int = 1 << 16):
    path = str(tmp_path / "ring")
    rd = Ring.create(path, capacity, native=reader == "native")
    wr = Ring.attach(path, capacity, native=writer == "native")
    rd.unlink()
    assert (rd.native, wr.native) == (reader == "native", writer == "native")
    return wr, rd


@pytest.mark.parametrize("writer,reader", KINDS)
def test_frames_of_every_size_and_kind_cross_between_implementations(tmp_path, writer, reader):
    """Empty, small (copied out), pinned (> COPY_OUT_NBYTES) and pieced (> a quarter of the
    ring) messages, engine headers and driver kinds, wrapping many times round a 64 KiB
    ring, payloads held a while by the 'engine' and then let go: every byte arrives in order."""
    wr, rd = _pair(tmp_path, writer, reader)
    rng = np.random.default_rng(7)
    sizes = [0, 1, 8, 100, COPY_OUT_NBYTES, COPY_OUT_NBYTES + 1, 12000, 16000, 40000]
    msgs = []
    for i in range(300):
        n = int(sizes[i % len(sizes)] if i % 2 else rng.integers(0, 30000))
        kind = None
        if i % 7 == 0:          # driver frames: small, no engine header
            kind, n = (KIND_CMA, KIND_CMA_DONE)[i % 2], n % 64
        arr = rng.integers(0, 255, n, dtype=np.uint8)
        if n % 4 == 0 and i % 3 == 0:
            arr = arr.view(np.float32)          # any contiguous buffer, itemsize > 1
        msgs.append((kind, b"" if kind else b"hdr%03d" % i, arr))
    got, held, sent = [], [], 0
    for step in range(50000):
        while sent < len(msgs) and len(wr._out) < 5:
            kind, header, arr = msgs[sent]
            b = arr.view(np.uint8)
            cut = len(b) // 3
            wr.enqueue(kind or len(header), header, [b[:cut], arr[cut // arr.itemsize:]]
                       if arr.itemsize == 1 else [arr], b.nbytes, sent)
            sent += 1
        wr.flush()
        frames = []
        rd.poll(frames, max_frames=7)
        for hdr_len, header, payload, _key in frames:
            kind, h, arr = msgs[len(got)]
            assert hdr_len == (kind or len(h)) and header == h
            got.append(bytes(payload) if payload is not None else b"")
            held.append(payload)
        frames = payload = None
        if step % 4 == 0:
            held.clear()
        if len(got) == len(msgs):
            break
    assert got == [arr.tobytes() for _, _, arr in msgs]
    held.clear()                # the last views let go: nothing stays pinned
    assert rd.pinned_nbytes == 0 and not wr.want_write
    wr.close()
    rd.close()


@pytest.mark.parametrize("writer,reader", KINDS)
def test_sleeping_reader_and_blocked_writer_handshakes(tmp_path, writer, reader):
    """The writer sees a reader's sleeping flag after publishing; a full ring sets the
    writer's blocked flag and the reader that frees space reports it (and clears it)."""
    wr, rd = _pair(tmp_path, writer, reader)
    rd.set_sleeping(SLEEP_FUTEX)
    wr.enqueue(3, b"abc", [np.ones(10, np.uint8)], 10, "t")
    assert wr.flush() == (["t"], SLEEP_FUTEX)
    rd.set_sleeping(0)
    for i in range(8):
        wr.enqueue(3, b"abc", [np.full(12000, i, np.uint8)], 12000, i)
    done, _ = wr.flush()
    assert wr.want_write and len(done) < 8
    frames = []
    want_bell = rd.poll(frames)
    assert len(frames) >= 2
    frames.clear()              # pinned views let go: the frames go back to the writer
    assert want_bell or rd.want_bell, "a blocked writer must be reported to the reader"
    while wr.want_write:
        wr.flush()
        rd.poll(frames)
        frames.clear()
    wr.close()
    rd.close()


@pytest.mark.parametrize("writer,reader", KINDS)
def test_write_now_keeps_order_and_refuses_what_must_queue(tmp_path, writer, reader):
    """write_now (the driver's send path) writes a whole frame at once and says how to wake
    the reader; it writes nothing — the caller queues — while frames are queued before it
    (their order holds), when the frame needs pieces, or when the ring lacks the space."""
    wr, rd = _pair(tmp_path, writer, reader)
    rd.set_sleeping(SLEEP_FUTEX)
    assert wr.write_now(3, b"aaa", [np.full(10, 1, np.uint8)], 10) == SLEEP_FUTEX
    rd.set_sleeping(0)
    assert wr.write_now(3, b"bbb", [], 0) == 0
    too_big = np.zeros(wr.max_piece, np.uint8)          # needs pieces: queue it
    assert wr.write_now(3, b"ccc", [too_big], too_big.nbytes) is None
    wr.enqueue(3, b"ccc", [too_big], too_big.nbytes, "big")
    # Queued frames go first: a later frame may not pass them.
    assert wr.write_now(3, b"ddd", [np.full(5, 4, np.uint8)], 5) is None
    wr.enqueue(3, b"ddd", [np.full(5, 4, np.uint8)], 5, "d")
    got = []
    while wr.want_write or len(got) < 4:
        wr.flush()
        frames = []
        rd.poll(frames)
        got += [(h, bytes(p) if p is not None else b"") for _, h, p, _ in frames]
        frames.clear()
    assert [h for h, _ in got] == [b"aaa", b"bbb", b"ccc", b"ddd"]
    assert got[0][1] == bytes([1] * 10) and got[3][1] == bytes([4] * 5)
    assert got[2][1] == too_big.tobytes()
    # A full ring: nothing written, nothing half-written; it fits again once read.
    block = np.full(12000, 9, np.uint8)
    n = 0
    while wr.write_now(3, b"eee", [block], block.nbytes) is not None:
        n += 1
    assert 2 <= n < 8
    frames = []
    rd.poll(frames)
    assert len(frames) == n and all(bytes(p) == block.tobytes() for _, _, p, _ in frames)
    frames.clear()
    assert wr.write_now(3, b"fff", [block], block.nbytes) is not None
    rd.poll(frames)
    assert [h for _, h, _, _ in frames] == [b"fff"]
    frames.clear()
    wr.close()
    rd.close()


@needs_native
def test_compiled_write_checks_its_arguments(tmp_path):
    wr, rd = _pair(tmp_path, "native", "native")
    with pytest.raises(ValueError, match="parts hold 5"):
        wr._nat.write(3, b"abc", [b"12345"], 6)
    with pytest.raises(ValueError, match="one ring piece"):
        wr._nat.write(3, b"abc", [bytes(1 << 15)], 1 << 15)     # > a quarter of 64 KiB
    with pytest.raises(ValueError, match="aligned u64"):
        wr._nat.load(3)
    wr.close()
    rd.close()
    with pytest.raises(ValueError, match="released"):
        wr._nat.load(0)


@needs_native
def test_compiled_futex_wakes_a_sleeper_on_the_ring_counter(tmp_path):
    if not futex.available():
        pytest.skip(f"futex wake-ups unavailable: {futex.unavailable_reason()}")
    wr, rd = _pair(tmp_path, "native", "native")
    ws = futex.WaitSet([(rd.data_bell_addr, False)])
    assert ws._c_wait is not None
    d0 = rd.data_bell()
    woke = threading.Event()

    def sleeper():
        ws.wait([d0], 30.0)
        woke.set()
    t = threading.Thread(target=sleeper)
    t.start()
    assert not woke.wait(0.2)
    wr.enqueue(3, b"abc", [], 0, None)
    wr.flush()
    futex.wake(wr.data_bell_addr)
    assert woke.wait(10)
    t.join()
    ws.wait([d0], 5.0)          # stale value: returns at once (bounded either way)
    wr.close()
    rd.close()


def test_native_off_forces_the_python_rings(tmp_path):
    """The native=0 test hook: a job's rings run the Python hot path even where the
    compiled one is built (and it says so)."""
    from polycast.config import Hooks
    off = Hooks(native=False)
    assert not native.in_use(off)
    r = Ring.create(str(tmp_path / "r"), 1 << 16, native.in_use(off))
    r.unlink()
    assert not r.native
    assert "pure Python (" in native.describe(off)
    if native.ring is not None:
        assert native.describe(off) == "shm rings: pure Python (test hook native=0)"
        assert native.in_use(Hooks()) and "compiled" in native.describe(Hooks())


OK = re.compile(r"SELFTEST algos OK (\d+) checks")
INFO = re.compile(r"polycast INFO shm rings: (compiled hot path|pure Python \(([^)]*)\))")


def test_job_with_compiled_and_python_ranks_is_exact():
    """3 shm ranks, rank 1 on the Python rings (native=0 test hook), the others on the compiled
    ones where built: every collective and algorithm exact (single-copy off, so the rings
    carry every byte), each rank saying at POLYCAST_DEBUG=INFO which rings it runs."""
    results = spawn_ranks(3, ["-m", "polycast.tools.selftest", "--suite", "algos"],
                          env={"POLYCAST_TRANSPORT": "shm", "POLYCAST_SYMM": "0",
                               "POLYCAST_TEST_HOOKS": "cma=0", "POLYCAST_DEBUG": "INFO"},
                          per_rank={1: {"POLYCAST_TEST_HOOKS": "cma=0,native=0"}}, timeout=240)
    for r in results:
        assert r.returncode == 0 and OK.search(r.out), (
            f"rank {r.rank} exit {r.returncode}\n{r.out[-3000:]}\n{r.err[-3000:]}")
        m = INFO.search(r.err)
        assert m, r.err[-2000:]
        if r.rank == 1:
            assert m.group(2) in ("test hook native=0", native.why_not)
        elif native.ring is not None:
            assert m.group(1) == "compiled hot path"


def test_rings_on_a_cpu_without_total_store_order(monkeypatch):
    """The compiled rings order their accesses, so they are offered where the Python ones
    (and symm, offload) are not: on arm64 the rings need the compiled helper."""
    from polycast.runtime.transport import shm
    compiled, why_not = native.ring, native.why_not
    monkeypatch.setattr(shm.platform, "machine", lambda: "aarch64")
    assert "store ordering" in shm.shm_unavailable_reason()     # Python shared memory: no
    monkeypatch.setattr(shm._native, "ring", None)
    assert "store ordering" in shm.rings_unavailable_reason()   # Python rings: no
    if compiled is None:
        pytest.skip(f"compiled ring helper not in use: {why_not}")
    monkeypatch.setattr(shm._native, "ring", compiled)
    assert shm.rings_unavailable_reason() in (None, f"{shm.SHM_DIR} is not a writable directory")


AS_ARM64 = ("import platform, runpy; platform.machine = lambda: 'aarch64'; "
            "runpy.run_module('polycast.tools.selftest', run_name='__main__')")
TRANSPORTS = re.compile(r"SELFTEST algos OK \d+ checks .* transports=(\S+)")


@needs_native
def test_job_on_a_weakly_ordered_cpu_uses_rings_only_between_compiled_ranks():
    """3 ranks that see an arm64 CPU, rank 2 without the compiled helper: ranks 0 and 1 talk
    over their (compiled) rings, rank 2 over TCP with both (it says why at INFO); exact."""
    results = spawn_ranks(3, ["-c", AS_ARM64, "--suite", "algos"],
                          env={"POLYCAST_SYMM": "0", "POLYCAST_TEST_HOOKS": "cma=0",
                               "POLYCAST_DEBUG": "INFO"},
                          per_rank={2: {"POLYCAST_TEST_HOOKS": "cma=0,native=0"}}, timeout=240)
    for r in results:
        m = TRANSPORTS.search(r.out)
        assert r.returncode == 0 and m, (
            f"rank {r.rank} exit {r.returncode}\n{r.out[-3000:]}\n{r.err[-3000:]}")
        assert m.group(1) == ("tcp" if r.rank == 2 else "shm,tcp"), m.group(0)


@needs_native
def test_forced_shm_with_a_rank_that_cannot_run_rings_fails_on_every_rank():
    results = spawn_ranks(2, ["-c", AS_ARM64, "--suite", "algos"],
                          env={"POLYCAST_TRANSPORT": "shm", "POLYCAST_SYMM": "0"},
                          per_rank={1: {"POLYCAST_TEST_HOOKS": "native=0"}}, timeout=120)
    assert results[0].returncode != 0 and \
        "ranks [1] cannot run the shm rings" in results[0].err, results[0].err[-2000:]
    assert results[1].returncode != 0 and \
        "x86-64 store ordering" in results[1].err, results[1].err[-2000:]


def test_one_ring_layout_read_by_both_sides(tmp_path):
    """ring_layout.h is the one definition: the Python rings take their offsets from it, the
    compiled helper was built from it, and a header that says otherwise than the build makes
    the Python rings run instead of a stale helper."""
    from polycast.runtime.transport import frames, layout, shm
    L = layout.LAYOUT
    assert (shm.CTRL_NBYTES, shm.HEAD, shm.TAIL, shm.DATA_BELL, shm.SPACE_BELL, shm.ALIGN,
            shm.KIND_WRAP) == (L["CTRL_NBYTES"], L["SLOT_HEAD"], L["SLOT_TAIL"],
                               L["SLOT_DATA_BELL"], L["SLOT_SPACE_BELL"], L["ALIGN"],
                               L["KIND_WRAP"])
    assert frames.PREFIX_NBYTES == L["PREFIX_NBYTES"] and frames.KIND_CMA == L["KIND_CMA"]
    if native.ring is not None:
        assert native.ring.LAYOUT == {k: L[k] for k in native.ring.LAYOUT}
    other = tmp_path / "ring_layout.h"
    other.write_text(open(layout._HEADER).read().replace("#define CTRL_NBYTES 256",
                                                         "#define CTRL_NBYTES 512"))
    assert layout.read_defines(str(other))["CTRL_NBYTES"] == 512
