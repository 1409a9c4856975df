"""The host's receive cost per chunk: the data behind ``polycast nic --preset host-python``
and ``--preset host-native``.

Measures, per multicast chunk (one datagram) on this machine, CPU seconds of the two receive
paths a polycast rank runs, at several chunk sizes, in the same run:

* **host-python** (the Python datagram path):

  * ``udp recv``   - the runtime's real UDP receive: ``sock.recv(65536)`` of a datagram
                     queued on a loopback socket (the kernel's copy to user space and the
                     syscall). The datagrams are sent first and then drained, so only the
                     receiver's side is timed; the kernel's own receive processing runs in
                     the sender's ``sendto`` on loopback (softirq) and is shown apart
                     (``loopback sendto``), not charged to the receive thread: on a real
                     host it runs in interrupt context, on any core.
  * ``engine``     - ``Engine.on_datagram`` (wire parse, checks, bitmap, Deliver) plus the
                     placement copy the driver does for it (``Buffers.deliver``), on a real
                     2-rank mcast broadcast schedule.

* **host-native** (the compiled datagram path, runtime/transport/_dgram.c, when built):

  * ``recv+place`` - ``Placer.recv``: recvmmsg batches from the same kind of loopback
                     socket, header checks, the copy into the receive buffer (or, from 4 KiB
                     datagrams, landing in place, as the runtime does) and the bitmap, for
                     the stream the engine opened (its real OpenStream);
  * ``engine``     - ``Engine.on_stream_progress`` for the chunk ranges each batch reports
                     (amortized over the batch).

Each path is fitted as seconds = a + b * chunk_bytes over the sizes (least squares) and
written with this machine's clock to ``polycast/models/host_python.json`` and
``host_native.json``, which the presets load. Best of ``--repeats`` runs (CPU time, the
machine is shared). Usage::

    python bench/nic.py [--chunks 2000] [--repeats 5] [--no-write-preset]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

from polycast.algorithms import build  # noqa: E402
from polycast.engine import Engine, EngineConfig  # noqa: E402
from polycast.engine.actions import Deliver, Multicast  # noqa: E402
from polycast.memory import Buffers  # noqa: E402
from polycast.models.nic import HOST_NATIVE_FILE, HOST_PYTHON_FILE  # noqa: E402

# 1428 and 8928: one frame at MTU 1500 and 9000 (runtime/mcast.py); 60000: one host's
SIZES = (1024, 1428, 4096, 8928, 16384, 60000)


def clock_hz() -> float:
    """This machine's core clock from /proc/cpuinfo (its first 'cpu MHz'); 0 if unknown."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("cpu mhz"):
                    return float(line.split(":")[1]) * 1e6
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def engine_cost(chunk: int, nchunks: int, repeats: int) -> float:
    """Best CPU seconds per datagram of Engine.on_datagram + Buffers.deliver."""
    count = chunk * nchunks // 4
    sched = build("broadcast", "mcast", 2, count)
    cfg = EngineConfig(mtu_nbytes=chunk)
    best = float("inf")
    src = np.arange(count, dtype=np.float32)
    for rep in range(repeats):
        root, peer = Engine(0, 2, config=cfg), Engine(1, 2, config=cfg)
        sbufs, rbufs = Buffers(), Buffers()
        sbufs.register(rep, sched, 0, src, np.empty_like(src))
        dst = np.full(count, -1.0, dtype=np.float32)   # touched: a reused, warm buffer
        rbufs.register(rep, sched, 1, None, dst)
        wires = []
        for a in root.post(rep, sched, 4, 0.0):
            if type(a) is Multicast:
                body = bytes(sbufs.gather(a.payload)) if a.payload is not None else b""
                wires.append(a.header.pack() + body)
        peer.post(rep, sched, 4, 0.0)
        on_datagram, deliver = peer.on_datagram, rbufs.deliver
        c0 = time.process_time()
        for w in wires:
            for act in on_datagram(w, 0.0):
                if type(act) is Deliver:
                    deliver(act.region, act.payload, act.reduce)
        dt = time.process_time() - c0
        if not np.array_equal(dst, src):
            raise RuntimeError("the receiver's buffer is not the root's: the bench is wrong")
        best = min(best, dt / len(wires))
    return best


def _loopback(chunk: int, nchunks: int):
    """A receiving socket on loopback with the runtime's 64 MiB buffer, a sending one, the
    address, and how many datagrams of ``chunk`` bytes fit queued at once (the kernel
    charges about twice the payload per queued datagram: stay well inside)."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    try:
        rx.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 64 << 20)
    except OSError:
        pass
    rx.bind(("127.0.0.1", 0))
    rx.setblocking(False)
    rcvbuf = rx.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    return rx, tx, rx.getsockname(), max(16, min(nchunks, rcvbuf // (2 * (chunk + 1024))))


def udp_cost(chunk: int, nchunks: int, repeats: int) -> tuple[float, float]:
    """Best CPU seconds per datagram of the receiver's recv(65536), and of the sender's
    sendto on loopback (which carries the kernel's receive-side processing)."""
    rx, tx, addr, batch = _loopback(chunk, nchunks)
    try:
        payload = bytes(chunk)
        best_rx = best_tx = float("inf")
        for _ in range(repeats):
            c0 = time.process_time()
            for _ in range(batch):
                tx.sendto(payload, addr)
            best_tx = min(best_tx, (time.process_time() - c0) / batch)
            got = 0
            recv = rx.recv
            c0 = time.process_time()
            while True:
                try:
                    got += len(recv(65536))
                except BlockingIOError:
                    break
            dt = time.process_time() - c0
            if got != batch * chunk:
                raise RuntimeError(f"loopback dropped datagrams ({got} of {batch * chunk} B): "
                                   "rerun on a quieter machine")
            best_rx = min(best_rx, dt / batch)
        return best_rx, best_tx
    finally:
        rx.close()
        tx.close()


def native_cost(chunk: int, nchunks: int, repeats: int, landing: bool = False
                ) -> tuple[float, float] | None:
    """Best CPU seconds per datagram of the compiled path's Placer.recv (recvmmsg, checks,
    placement) and of the engine's on_stream_progress for what it reported; None when the
    helper is not built."""
    from polycast.engine.actions import OpenStream
    from polycast.runtime.transport import dgram
    if not dgram.available():
        return None
    count = chunk * nchunks // 4
    sched = build("broadcast", "mcast", 2, count)
    src = np.arange(count, dtype=np.float32)
    rx, tx, addr, batch = _loopback(chunk, nchunks)
    try:
        best_rx = best_eng = float("inf")
        for rep in range(repeats):
            root = Engine(0, 2, config=EngineConfig(mtu_nbytes=chunk))
            peer = Engine(1, 2, config=EngineConfig(mtu_nbytes=chunk, external_streams=True))
            sbufs = Buffers()
            sbufs.register(rep, sched, 0, src, np.empty_like(src))
            dst = np.full(count, -1.0, dtype=np.float32)   # touched: a reused, warm buffer
            wires = [a.header.pack() + (bytes(sbufs.gather(a.payload))
                                        if a.payload is not None else b"")
                     for a in root.post(rep, sched, 4, 0.0) if type(a) is Multicast]
            opened = [a for a in peer.post(rep, sched, 4, 0.0) if type(a) is OpenStream][0]
            placer = dgram.Placer(None, landing=landing)
            key = (peer.comm, opened.seq & 0xFFFFFFFF, opened.root, opened.ordinal)
            placer.open(key, opened.sig, dst, opened.region.runs, opened.chunk_elems,
                        opened.nchunks)
            t_rx = t_eng = 0.0
            got = 0
            for i in range(0, len(wires), batch):
                for w in wires[i:i + batch]:
                    tx.sendto(w, addr)
                c0 = time.process_time()
                reports = []
                while True:
                    prog, up, n, _, _ = placer.recv(rx, 1024)
                    if not n and not up:
                        break
                    got += n
                    reports.append(prog)
                c1 = time.process_time()
                for prog in reports:
                    for (_, seq, r, o), ranges, eos in prog:
                        peer.on_stream_progress(seq, r, o, ranges, 0.0, eos=eos)
                t_eng += time.process_time() - c1
                t_rx += c1 - c0
            if got != len(wires) or not np.array_equal(dst, src):
                raise RuntimeError(f"the native path placed {got} of {len(wires)} datagrams "
                                   "(loopback dropped some?): rerun on a quieter machine")
            best_rx = min(best_rx, t_rx / len(wires))
            best_eng = min(best_eng, t_eng / len(wires))
        return best_rx, best_eng
    finally:
        rx.close()
        tx.close()


def fit(sizes, seconds) -> tuple[float, float]:
    """Least-squares a + b * size (b clipped at 0)."""
    x = np.asarray(sizes, dtype=float)
    y = np.asarray(seconds, dtype=float)
    b, a = np.polyfit(x, y, 1)
    if b < 0:
        b, a = 0.0, float(y.mean())
    return float(a), float(b)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=2000, help="datagrams per run (default 2000)")
    ap.add_argument("--repeats", type=int, default=5, help="runs per case; best is kept")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "nic.json"))
    ap.add_argument("--preset-file", default=HOST_PYTHON_FILE,
                    help="where the host-python preset data goes")
    ap.add_argument("--native-preset-file", default=HOST_NATIVE_FILE,
                    help="where the host-native preset data goes")
    ap.add_argument("--no-write-preset", action="store_true",
                    help="measure and print only; leave the preset file alone")
    args = ap.parse_args(argv)
    if args.chunks <= 0 or args.repeats <= 0:
        ap.error("--chunks and --repeats must be > 0")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    rows, native_rows = [], []
    for c in SIZES:
        eng = engine_cost(c, args.chunks, args.repeats)
        urx, utx = udp_cost(c, args.chunks, args.repeats)
        rows.append({"chunk_nbytes": c, "udp_recv_s": urx, "engine_place_s": eng,
                     "total_s": urx + eng, "loopback_sendto_s": utx})
        # the path the runtime takes for this size (landing in place from 4 KiB)
        from polycast.runtime.transport import dgram
        nat = native_cost(c, args.chunks, args.repeats, c >= dgram.LANDING_MIN_NBYTES)
        if nat is not None:
            native_rows.append({"chunk_nbytes": c, "recv_place_s": nat[0],
                                "engine_progress_s": nat[1], "total_s": sum(nat)})
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    hz = clock_hz()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    common = {"clock_hz": hz or 1e9, "clock_from": "/proc/cpuinfo" if hz else "unknown (1 GHz)",
              "load_1min": load, "load_1min_after": load_after,
              "python": platform.python_version(), "machine": platform.machine(),
              "cpus": os.cpu_count(), "date": stamp, "command": "python bench/nic.py",
              "source": f"bench/nic.py, {stamp}, load {load:.1f}"}
    a, b = fit([r["chunk_nbytes"] for r in rows], [r["total_s"] for r in rows])
    _print(rows, a, b, hz, load)
    data = {"preset": "host-python", "seconds_per_chunk": a, "seconds_per_byte": b,
            "measured": rows, **common}
    presets = [(data, args.preset_file)]
    doc = {"bench": "nic", **data}
    if native_rows:
        na, nb = fit([r["chunk_nbytes"] for r in native_rows],
                     [r["total_s"] for r in native_rows])
        _print_native(native_rows, rows, na, nb, hz)
        ndata = {"preset": "host-native", "seconds_per_chunk": na, "seconds_per_byte": nb,
                 "measured": native_rows, **common}
        presets.append((ndata, args.native_preset_file))
        doc["native"] = ndata
    else:
        print("host-native: the datagram helper is not built; preset left alone")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(doc, fh, indent=2)
    print(f"wrote {args.json}")
    if not args.no_write_preset:
        for d, path in presets:
            with open(path, "w") as fh:
                json.dump(d, fh, indent=2)
                fh.write("\n")
            print(f"wrote {path} (the {d['preset']} preset)")
    return 0


def _print(rows, a, b, hz, load) -> None:
    from polycast.cli.table import print_table
    cols = ["chunk B", "udp recv us", "engine+place us", "total us", "Gbit/s (1 core)",
            "loopback sendto us"]
    print_table(f"polycast's receive path per chunk, CPU us (best; load {load:.1f})", cols,
                [[r["chunk_nbytes"], r["udp_recv_s"] * 1e6, r["engine_place_s"] * 1e6,
                  r["total_s"] * 1e6, r["chunk_nbytes"] * 8 / r["total_s"] / 1e9,
                  r["loopback_sendto_s"] * 1e6] for r in rows])
    print(f"fit: {a * 1e6:.2f} us per chunk + {b * 1e9:.3f} ns per byte"
          + (f" = {a * hz:.0f} cycles + {b * hz:.3f} cycles/B at {hz / 1e9:.2f} GHz" if hz else ""))
    for c in (4096, 60000):
        t = a + b * c
        print(f"  {c} B chunks: {1 / t / 1e3:.0f} k chunks/s = {c * 8 / t / 1e9:.2f} Gbit/s "
              "on one core")


def _print_native(rows, py_rows, a, b, hz) -> None:
    from polycast.cli.table import print_table
    cols = ["chunk B", "recv+place us", "engine us", "total us", "Gbit/s (1 core)",
            "x Python path"]
    py = {r["chunk_nbytes"]: r["total_s"] for r in py_rows}
    print_table("the compiled datagram path per chunk, CPU us (best; same run)", cols,
                [[r["chunk_nbytes"], r["recv_place_s"] * 1e6, r["engine_progress_s"] * 1e6,
                  r["total_s"] * 1e6, r["chunk_nbytes"] * 8 / r["total_s"] / 1e9,
                  py[r["chunk_nbytes"]] / r["total_s"]] for r in rows])
    print(f"fit: {a * 1e6:.3f} us per chunk + {b * 1e9:.3f} ns per byte"
          + (f" = {a * hz:.0f} cycles + {b * hz:.3f} cycles/B at {hz / 1e9:.2f} GHz" if hz else ""))
    for c in (1428, 8928, 60000):
        t = a + b * c
        print(f"  {c} B chunks: {1 / t / 1e3:.0f} k chunks/s = {c * 8 / t / 1e9:.2f} Gbit/s "
              "on one core")


if __name__ == "__main__":
    sys.exit(main())
