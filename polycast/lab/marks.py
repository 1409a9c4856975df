"""Rank side of counter marks (see :mod:`polycast.lab.runner`).

``mark(comm, "before allgather")`` is a collective: every rank waits in a barrier, rank 0
asks the runner to read the lab's link counters and waits (bounded) for the answer, and a
second barrier releases everyone — so no byte of the code after the mark is counted before
it. Outside ``polycast lab run --marks`` (no POLYCAST_LAB_MARKS) it is only a barrier.
"""

from __future__ import annotations

import itertools
import os
import time

from ..errors import CollectiveTimeout

_seq = itertools.count()
TIMEOUT_S = 30.0


def mark(comm, label: str) -> None:
    d = os.environ.get("POLYCAST_LAB_MARKS")
    comm.Barrier()
    n = next(_seq)
    if d and comm.rank == 0:
        base = os.path.join(d, f"{n:06d}")
        with open(base + ".tmp", "w") as fh:
            fh.write(label)
        os.replace(base + ".tmp", base + ".req")
        deadline = time.monotonic() + TIMEOUT_S
        while not os.path.exists(base + ".ack"):
            if time.monotonic() > deadline:
                raise CollectiveTimeout(f"lab mark {label!r}: the runner did not read the "
                                        f"counters within {TIMEOUT_S:g} s")
            time.sleep(0.001)
        os.unlink(base + ".ack")
    comm.Barrier()
