"""The host's receive cost per chunk: the data behind ``polycast nic --preset host-python``.

Measures, per multicast chunk (one datagram) on this machine, CPU seconds of the receive
path a polycast rank runs in Python, at several chunk sizes:

* ``udp recv``   - the runtime's real UDP receive: ``sock.recv(65536)`` of a datagram
                   queued on a loopback socket (the kernel's copy to user space and the
                   syscall). The datagrams are sent first and then drained, so only the
                   receiver's side is timed; the kernel's own receive processing runs in
                   the sender's ``sendto`` on loopback (softirq) and is shown apart
                   (``loopback sendto``), not charged to the receive thread: on a real host
                   it runs in interrupt context, on any core.
* ``engine``     - ``Engine.on_datagram`` (wire parse, checks, bitmap, Deliver) plus the
                   placement copy the driver does for it (``Buffers.deliver``), on a real
                   2-rank mcast broadcast schedule.

It fits seconds = a + b * chunk_bytes over the sizes (least squares on udp recv + engine)
and writes ``a``, ``b`` and this machine's clock to ``polycast/models/host_python.json``,
which the host-python preset loads. Best of ``--repeats`` runs (CPU time, the machine is
shared). Usage::

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
from polycast.models.nic import HOST_PYTHON_FILE  # noqa: E402

SIZES = (1024, 4096, 16384, 60000)       # 60000: polycast's datagram on one host


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
        dst = np.zeros(count, dtype=np.float32)
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


def udp_cost(chunk: int, nchunks: int, repeats: int) -> tuple[float, float]:
    """Best CPU seconds per datagram of the receiver's recv(65536), and of the sender's
    sendto on loopback (which carries the kernel's receive-side processing)."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
        try:
            rx.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 64 << 20)
        except OSError:
            pass
        rx.bind(("127.0.0.1", 0))
        rx.setblocking(False)
        addr = rx.getsockname()
        payload = bytes(chunk)
        # the kernel charges about twice the payload per queued datagram: stay well inside
        rcvbuf = rx.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        batch = max(16, min(nchunks, rcvbuf // (2 * (chunk + 1024))))
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
    ap.add_argument("--no-write-preset", action="store_true",
                    help="measure and print only; leave the preset file alone")
    args = ap.parse_args(argv)
    if args.chunks <= 0 or args.repeats <= 0:
        ap.error("--chunks and --repeats must be > 0")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    rows = []
    for c in SIZES:
        eng = engine_cost(c, args.chunks, args.repeats)
        urx, utx = udp_cost(c, args.chunks, args.repeats)
        rows.append({"chunk_nbytes": c, "udp_recv_s": urx, "engine_place_s": eng,
                     "total_s": urx + eng, "loopback_sendto_s": utx})
    a, b = fit([r["chunk_nbytes"] for r in rows], [r["total_s"] for r in rows])
    hz = clock_hz()
    _print(rows, a, b, hz, load)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    data = {"preset": "host-python", "seconds_per_chunk": a, "seconds_per_byte": b,
            "clock_hz": hz or 1e9, "clock_from": "/proc/cpuinfo" if hz else "unknown (1 GHz)",
            "measured": rows, "load_1min": load, "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count(), "date": stamp,
            "command": "python bench/nic.py",
            "source": f"bench/nic.py, {stamp}, load {load:.1f}"}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"bench": "nic", **data}, fh, indent=2)
    print(f"wrote {args.json}")
    if not args.no_write_preset:
        with open(args.preset_file, "w") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
        print(f"wrote {args.preset_file} (the host-python preset)")
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


if __name__ == "__main__":
    sys.exit(main())
