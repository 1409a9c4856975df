"""TCP over loopback: what a pair of ranks moves, beside the raw-socket ceiling (issue 9).

Each row moves ``--size`` bytes per call between local processes over TCP on 127.0.0.1:

* ``raw uni``/``raw bidi``: two forked processes (at real-time priority with --realtime), one TCP connection set up as polycast's
  links are (TCP_NODELAY, 4 MiB SO_SNDBUF/SO_RCVBUF), ``sendall`` of a numpy array and
  ``recv_into`` a preallocated one (bidi: both ways at once, one non-blocking select loop
  per process, as polycast's progress thread does): the ceiling for a Python process.
  ``raw ring 4``: 4 processes in a ring of such connections, each sending 3/4 of the size
  to its right while receiving as much from its left: a ring allgather's ceiling (busbw).
* ``pair uni``: 2-rank broadcast (binomial), ``pair bidi``: 2-rank allgather (ring), and
  ``ring 4``: 4-rank allgather (ring), ``mcast 4``: 4-rank allgather (mcast: the data
  in UDP multicast datagrams on loopback, the tokens over TCP), all ``polycast bench
  --transport tcp`` with POLYCAST_SYMM=0 (the engine path).

``GB/s`` is the bytes the pair moves per second (uni: size/t; bidi: size/t, half each way;
nccl-tests' algbw), and for the 4-rank rows busbw. ``--before DIR`` runs every polycast row on
DIR (an older checkout: ``git archive main | tar -x -C DIR``) and on this tree,
alternately, ``--rounds`` times: a before/after within the same minutes. ``--realtime``
runs the ranks at ``chrt -r 1`` (a loaded shared machine then measures like a quiet one;
keep such runs short). Prints a table and writes bench/results/tcp_pair.json. Usage::

    python bench/tcp_pair.py [--before DIR] [--rounds 3] [--size 16MiB] [--realtime]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(HERE)
# The raw ceiling's socket buffers: fixed 4 MiB measured fastest for raw sockets. polycast's
# links leave them to the kernel (fixed buffers stalled now and then under its traffic).
SOCK_BUF_NBYTES = 4 << 20
CASES = [
    # (label, nranks, collective, algorithm, metric)
    ("pair uni (broadcast binomial)", 2, "broadcast", "binomial", "algbw"),
    ("pair bidi (allgather ring)", 2, "allgather", "ring", "algbw"),
    ("ring 4 (allgather ring, busbw)", 4, "allgather", "ring", "busbw"),
    ("mcast 4 (allgather mcast, busbw)", 4, "allgather", "mcast", "busbw"),
]


def _setup(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, SOCK_BUF_NBYTES)
    return sock


def _recv_all(sock: socket.socket, view: memoryview) -> None:
    pos = 0
    while pos < len(view):
        got = sock.recv_into(view[pos:])
        if not got:
            raise EOFError("raw peer closed")
        pos += got


def _both_ways(sock: socket.socket, out: memoryview, into: memoryview, limit_s: float,
               rsock: socket.socket | None = None) -> None:
    """Send ``out`` on ``sock`` while receiving ``into`` from ``rsock`` (default: sock)."""
    rsock = rsock or sock
    sock.setblocking(False)
    rsock.setblocking(False)
    sent = got = 0
    deadline = time.monotonic() + limit_s
    while sent < len(out) or got < len(into):
        if time.monotonic() > deadline:
            raise TimeoutError("raw transfer stalled")
        r, w, _ = select.select([rsock] if got < len(into) else [],
                                [sock] if sent < len(out) else [], [], 1.0)
        if w:
            try:
                sent += sock.send(out[sent:])
            except BlockingIOError:
                pass
        if r:
            try:
                n = rsock.recv_into(into[got:])
            except BlockingIOError:
                n = -1
            if n == 0:
                raise EOFError("raw peer closed")
            got += max(n, 0)
    sock.setblocking(True)
    rsock.setblocking(True)


def raw_ring(nranks: int, nbytes: int, iters: int, realtime: bool = False) -> float:
    """busbw of ``nranks`` processes in a TCP ring, each sending (nranks-1)/nranks of
    ``nbytes`` to its right while receiving as much from its left (no step dependencies:
    a ceiling for a ring allgather)."""
    old = _priority(realtime)
    pairs = []
    try:
        for _ in range(nranks):         # pairs[i]: rank i's socket to i+1, i+1's from i
            lsock = socket.socket()
            lsock.bind(("127.0.0.1", 0))
            lsock.listen(1)
            a = _setup(socket.create_connection(lsock.getsockname(), timeout=10))
            b = _setup(lsock.accept()[0])
            lsock.close()
            pairs.append((a, b))
        each = nbytes * (nranks - 1) // nranks
        pids, reads = [], []
        for i in range(nranks):
            rfd, wfd = os.pipe()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    out, into = np.ones(each, np.uint8), np.empty(each, np.uint8)
                    right, left = pairs[i][0], pairs[i - 1][1]
                    for k in range(iters + 2):
                        if k == 2:
                            t0 = time.perf_counter()
                        _both_ways(right, memoryview(out), memoryview(into), 60.0, left)
                    os.write(wfd, f"{time.perf_counter() - t0}".encode())
                    code = 0
                finally:
                    os._exit(code)
            os.close(wfd)
            pids.append(pid)
            reads.append(rfd)
        seconds = []
        for pid, rfd in zip(pids, reads):
            _, status = os.waitpid(pid, 0)
            text = os.read(rfd, 64).decode()
            os.close(rfd)
            if status != 0 or not text:
                raise RuntimeError(f"raw ring: a process failed (status {status})")
            seconds.append(float(text))
    finally:
        for a, b in pairs:
            a.close()
            b.close()
        os.sched_setscheduler(0, *old)
    return each * iters / max(seconds) / 1e9


def _raw_side(sock: socket.socket, role: int, mode: str, nbytes: int, iters: int) -> float:
    half = nbytes // 2
    src = np.ones(nbytes, np.uint8)
    dst = np.empty(nbytes, np.uint8)
    sv, dv = memoryview(src), memoryview(dst)
    t0 = 0.0
    for i in range(iters + 2):          # two warm-up transfers
        if i == 2:
            t0 = time.perf_counter()
        if mode == "uni":
            if role == 0:
                sock.sendall(sv)
                _recv_all(sock, dv[:1])     # the receiver has all of it
            else:
                _recv_all(sock, dv)
                sock.sendall(b"k")
        else:
            _both_ways(sock, sv[:half], dv[:half], 60.0)
    return time.perf_counter() - t0


def _priority(realtime: bool):
    """Real-time round-robin priority 1 for this process (as chrt -r 1); the old policy."""
    old = (os.sched_getscheduler(0), os.sched_getparam(0))
    if realtime:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
    return old


def raw(mode: str, nbytes: int, iters: int, realtime: bool = False) -> float:
    """GB/s the pair moves with plain sockets (see the module docstring)."""
    old = _priority(realtime)
    try:
        return _raw(mode, nbytes, iters)
    finally:
        os.sched_setscheduler(0, *old)


def _raw(mode: str, nbytes: int, iters: int) -> float:
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    port = lsock.getsockname()[1]
    pid = os.fork()
    if pid == 0:        # the other end; leaves with os._exit, whatever happens
        code = 1
        try:
            s = _setup(socket.create_connection(("127.0.0.1", port), timeout=10))
            s.settimeout(60)
            _raw_side(s, 1, mode, nbytes, iters)
            code = 0
        finally:
            os._exit(code)
    try:
        lsock.settimeout(10)
        s = _setup(lsock.accept()[0])
        s.settimeout(60)
        seconds = _raw_side(s, 0, mode, nbytes, iters)
        s.close()
    finally:
        lsock.close()
        _, status = os.waitpid(pid, 0)
    if status != 0:
        raise RuntimeError(f"raw {mode}: the other end failed (status {status})")
    return nbytes * iters / seconds / 1e9


def polycast_row(tree: str, nranks: int, coll: str, algo: str, nbytes: int, iters: int,
                 realtime: list) -> dict:
    env = dict(os.environ, PYTHONPATH=tree, POLYCAST_SYMM="0")
    cmd = [*realtime, sys.executable, "-m", "polycast.cli.main", "bench", "-n", str(nranks),
           coll, "--algo", algo, "--sizes", str(nbytes), "--transport", "tcp",
           "--iters", str(iters * 4), "--warmup", "2", "--timeout", "120", "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180, cwd=tree)
    if res.returncode != 0:
        raise RuntimeError(f"{coll} {algo} on {tree} failed:\n{res.stderr[-2000:]}")
    row = json.loads(res.stdout)[0]
    if row["correct"] != "ok" and row["correct"] is not True:
        raise RuntimeError(f"{coll} {algo} on {tree}: wrong result ({row['correct']})")
    return row


def main(argv=None) -> int:
    from polycast.units import format_size, parse_size
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="16MiB")
    p.add_argument("--iters", type=int, default=10, help="timed transfers per measurement")
    p.add_argument("--rounds", type=int, default=3, help="measurements per row (median shown)")
    p.add_argument("--before", help="an older checkout to measure alternately with this one")
    p.add_argument("--realtime", action="store_true",
                   help="ranks at real-time round-robin priority 1 (chrt -r 1; root)")
    p.add_argument("--cases", help="comma-separated labels' first words to run "
                   "(pair, ring, mcast; default all)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "tcp_pair.json"))
    args = p.parse_args(argv)
    cases = [c for c in CASES
             if not args.cases or c[0].split()[0] in args.cases.split(",")]
    nbytes = parse_size(args.size)
    from rank_jobs import realtime_prefix
    realtime = realtime_prefix(p) if args.realtime else []
    trees = ([("before", os.path.abspath(args.before))] if args.before else []) + [("now", TREE)]
    load0 = os.getloadavg()[0]
    got: dict = {}
    for rnd in range(args.rounds):
        for mode in ("uni", "bidi"):
            got.setdefault((f"raw {mode} (sockets)", "raw"), []).append(
                raw(mode, nbytes, args.iters, bool(realtime)))
        got.setdefault(("raw ring 4 (sockets, busbw)", "raw"), []).append(
            raw_ring(4, nbytes, args.iters, bool(realtime)))
        for label, n, coll, algo, metric in cases:
            # every other round the other tree goes first: no order bias in the medians
            for name, tree in (trees if rnd % 2 == 0 else trees[::-1]):
                row = polycast_row(tree, n, coll, algo, nbytes, args.iters, realtime)
                got.setdefault((label, name), []).append(row[metric])
    load1 = os.getloadavg()[0]
    rows = []
    print(f"TCP loopback, {format_size(nbytes)} per call, median of {args.rounds} "
          f"(load {load0:.1f} -> {load1:.1f}{', ranks at real-time priority' if realtime else ''})")
    print(f"{'case':34} {'tree':7} {'GB/s':>6}   all")
    for (label, name), vals in got.items():
        med = statistics.median(vals)
        print(f"{label:34} {name:7} {med:6.2f}   {', '.join(f'{v:.2f}' for v in vals)}")
        rows.append({"case": label, "tree": name, "nbytes": nbytes, "gbps": med,
                     "all_gbps": vals})
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "load": [load0, load1], "realtime": bool(realtime),
                   "before": args.before, "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
