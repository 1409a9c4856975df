"""Rank script for tests/test_dead_peer.py: ranks loop a collective on one path (shm, tcp,
mcast or symm) until rank 2 SIGKILLs or SIGSTOPs itself in the middle of one. Survivors
print ``SURVIVOR {json}`` (their error, and seconds from the signal to it).

Mode ``between``: rank 2 SIGKILLs itself right after a call returned, and ranks 1 and 3
(its ring neighbours) wait until they have seen it go before they call again, so their
next call fails when it is posted; rank 0, whose part of a ring needs only ranks 1 and 3,
calls at once (the window test_dead_peer[kill-shm] hit by chance in CI)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import numpy as np

import polycast
from polycast.errors import PolycastError

VICTIM = 2
DELAY_S = 0.4


def main() -> None:
    mode, path = sys.argv[1], sys.argv[2]
    comm = polycast.init()
    n = 1 << 18                                     # 1 MiB of float32
    send = np.full(n, comm.rank + 1, np.float32)
    recv = np.empty(n * comm.size, np.float32)

    def one():
        if path == "mcast":
            comm.Allgather(send[: n // 4], recv[: n // 4 * comm.size], algorithm="mcast")
        elif path == "symm":
            comm.Allreduce(send, recv[:n])          # auto: staged through symmetric memory
        else:
            comm.Allreduce(send, recv[:n], algorithm="ring")
    one()
    if path == "symm":
        assert comm.takes_symm(polycast.Collective.ALLREDUCE, send.dtype), "symm not taken"
    print("JOB " + comm._driver.world.job_id, flush=True)
    comm.Barrier()
    if mode == "between":
        between(comm, one)
        return
    t_signal = time.monotonic() + DELAY_S
    if comm.rank == VICTIM:
        sig = signal.SIGKILL if mode == "kill" else signal.SIGSTOP
        threading.Timer(DELAY_S, os.kill, (os.getpid(), sig)).start()

    def loop():
        while time.monotonic() < t_signal + 120:
            one()
    survive(comm, loop, t_signal)


def between(comm, one) -> None:
    one()
    t_kill = time.monotonic()
    if comm.rank == VICTIM:
        os.kill(os.getpid(), signal.SIGKILL)
    if comm.rank in (VICTIM - 1, VICTIM + 1):
        # Until this rank's driver has seen the victim's connection close (bounded).
        lost = comm._driver.peers.lost
        while VICTIM not in lost and time.monotonic() < t_kill + 5:
            time.sleep(0.01)
    survive(comm, one, t_kill)


def survive(comm, calls, t_signal: float) -> None:
    """Run ``calls``; a survivor prints its error and the seconds since the signal."""
    try:
        calls()
    except PolycastError as exc:
        print("SURVIVOR " + json.dumps({"rank": comm.rank, "error": type(exc).__name__,
                                        "message": str(exc),
                                        "seconds": time.monotonic() - t_signal}), flush=True)
        sys.exit(1)
    print("NO ERROR", flush=True)


if __name__ == "__main__":
    main()
