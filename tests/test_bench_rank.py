"""polycast bench's rank side times the blocking calls (as MPI programs and the MPI peers of
bench/peers.py do), and the I-variants + Wait only with --nonblocking."""

from __future__ import annotations

import numpy as np
import pytest

from polycast.collectives import Collective
from polycast.tools.bench_rank import measure


class _Done:
    def Wait(self):
        return None


class RecordingComm:
    """One rank that records which collective methods the bench calls."""
    size, rank = 1, 0

    def __init__(self):
        self.called: list[str] = []

    def __getattr__(self, name):
        if name[:1].isupper():             # Allreduce, Iallreduce, Bcast, Ibcast, ...
            def method(*args, **kw):
                self.called.append(name)
                return _Done() if name.startswith("I") else None
            return method
        raise AttributeError(name)

    def takes_symm(self, coll, dt, nbytes):
        return False

    def choose_algorithm(self, coll, nbytes, algo):
        return "fake"

    def stats(self):
        return None

    def transports(self):
        return {}

    def Barrier(self, **kw):
        return None

    def Allgather(self, send, recv, **kw):
        self.called.append("Allgather")
        recv[...] = send


@pytest.mark.parametrize("coll, blocking, nonblocking", [
    (Collective.ALLREDUCE, "Allreduce", "Iallreduce"),
    (Collective.ALLGATHER, "Allgather", "Iallgather"),
    (Collective.REDUCE_SCATTER, "Reduce_scatter_block", "Ireduce_scatter_block"),
    (Collective.BROADCAST, "Bcast", "Ibcast"),
])
def test_bench_times_blocking_calls_unless_asked_for_the_i_variants(coll, blocking,
                                                                    nonblocking):
    for flag, want, never in ((False, blocking, nonblocking), (True, nonblocking, blocking)):
        comm = RecordingComm()
        row = measure(comm, coll, None, 2, "float32", "sum", 0, iters=7, warmup=3,
                      check=False, nonblocking=flag)
        # 3 warm-up + 7 timed calls; the bench's own two Allgathers gather the times
        assert comm.called.count(want) == 10 + 2 * (want == "Allgather"), comm.called
        assert comm.called.count(never) == 2 * (never == "Allgather")
        assert row["calls"] == ("nonblocking" if flag else "blocking")
        assert np.isfinite(row["time_us"])
