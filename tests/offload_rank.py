"""A rank of the offload-mode failure tests (tests/test_offload.py): one scenario per run.

    python tests/offload_rank.py SCENARIO

Prints ``RESULT <what happened>`` lines the test reads. Every wait is bounded.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import polycast
from polycast.errors import CollectiveTimeout, InvalidArgument, OffloadLost


def main(scenario: str) -> int:
    comm = polycast.init(progress="offload")
    r = comm.rank
    drv = comm._driver
    print(f"RESULT server_pid {drv.server_pid}", flush=True)
    x = comm.empty(1000, np.float32)            # registered: fine in every scenario
    y = comm.empty(1000, np.float32)
    x[:] = 1
    comm.Allreduce(x, y)
    assert y[0] == comm.size

    if scenario == "kill-offload":
        # rank 1 is waiting in a call rank 0 has not joined when rank 0 kills the offload
        comm.Barrier()
        if r == 0:
            time.sleep(0.3)
            os.kill(drv.server_pid, 9)
            time.sleep(0.3)
        t0 = time.monotonic()
        try:
            comm.Allreduce(x, y)
            print("RESULT no error", flush=True)
        except OffloadLost as exc:
            print(f"RESULT OffloadLost after {time.monotonic() - t0:.2f}s: {exc}", flush=True)
        try:                                    # and every later call, at once
            comm.Bcast(x)
            print("RESULT later call ok", flush=True)
        except OffloadLost:
            print("RESULT later OffloadLost", flush=True)
        polycast.finalize()
        return 0

    if scenario == "timeout":
        if r == 0:
            try:
                comm.Allreduce(x, y)
                print("RESULT no error", flush=True)
            except CollectiveTimeout as exc:
                print(f"RESULT CollectiveTimeout: {exc}", flush=True)
        else:
            time.sleep(float(os.environ["POLYCAST_TIMEOUT"]) + 1.0)
        polycast.finalize()
        return 0

    if scenario == "unregistered":
        out = comm.empty(1000 * comm.size, np.float32)
        src = comm.empty(1000, np.float32)
        src[:] = r
        comm.Allgather(src, out)                # registered: fine
        ok = bool(np.all(out.reshape(comm.size, -1) == np.arange(comm.size)[:, None]))
        print(f"RESULT registered ok={ok}", flush=True)
        try:
            comm.Allgather(np.full(1000, r, np.float32), out)
            print("RESULT no error", flush=True)
        except InvalidArgument as exc:
            print(f"RESULT InvalidArgument: {exc}", flush=True)
        comm.Barrier()                          # nothing was posted: the next call works
        comm.Allreduce(x, y)
        print(f"RESULT after ok={y[0] == comm.size}", flush=True)
        polycast.finalize()
        return 0

    if scenario == "refuse":
        # rank 0's arguments fail its own checks: it refuses the call, rank 1's raises too
        try:
            if r == 0:
                drv.refuse(0, "rank 0's recvbuf is too small")
                raise InvalidArgument("refused here")
            comm.Allreduce(x, y)
            print("RESULT no error", flush=True)
        except polycast.PolycastError as exc:
            print(f"RESULT refused {type(exc).__name__}: {exc}", flush=True)
        comm.Allreduce(x, y)                    # the next call matches on every rank
        print(f"RESULT after ok={y[0] == comm.size}", flush=True)
        polycast.finalize()
        return 0

    if scenario == "lossy":
        exact = True
        for count in (5000, 200000):
            src = comm.empty(count, np.int32)
            src[:] = np.arange(count) + r
            out = np.zeros(count * comm.size, np.int32)      # staged
            comm.Allgather(src, out, algorithm="mcast")
            want = np.concatenate([np.arange(count) + p for p in range(comm.size)])
            exact = exact and bool(np.array_equal(out, want))
            b = np.arange(count, dtype=np.float64) if r == 1 else np.zeros(count)
            comm.Bcast(b, root=1, algorithm="mcast")
            exact = exact and bool(np.array_equal(b, np.arange(count, dtype=np.float64)))
        st = comm.stats()
        print(f"RESULT lossy exact={exact} recovered={st.recovered_bytes}", flush=True)
        polycast.finalize()
        return 0

    raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
