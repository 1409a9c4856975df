"""What every peer worker of bench/peers.py shares: the test data, the expected results and
the timing loop, so MPICH and gloo are measured exactly the same way.

Needs numpy only (no polycast import): the workers may run in another interpreter.

Timing (say it once, here): after ``warmup`` untimed calls and a barrier, each rank times
``case.iters`` back-to-back calls with ``time.perf_counter`` and divides by the count; the
reported time is the **maximum over ranks of that per-rank mean** (the slowest rank), the
conservative choice nccl-tests offers as ``-a 3`` and the one ``polycast bench`` makes.
bench/peers.py gives every peer the same ``iters`` per case.

Correctness: the inputs are small integers in float32 (exact under summation), the output
of the first call and of the last timed call are compared with numpy on every rank, and
the check passes only when every rank agrees.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import numpy as np

DTYPE = np.float32
COLLECTIVES = ("allgather", "allreduce", "broadcast", "reduce_scatter")
ROOT = 0


@dataclass(frozen=True)
class Case:
    """One measurement: ``count`` is the per-call element count as mpi4py/NCCL use it."""
    collective: str
    count: int
    nbytes: int              # nccl-tests' S, the size algbw divides by
    iters: int               # timed calls


@dataclass
class Measured:
    collective: str
    count: int
    nbytes: int
    dtype: str
    iters: int
    warmup: int
    time_us: float
    correct: bool
    detail: str = ""


def send_data(collective: str, rank: int, count: int, nranks: int = 1) -> np.ndarray:
    """Small distinct integers per rank: sums over a few ranks stay exact in float32.
    ``count`` x ``nranks`` of them for reduce_scatter (its input holds a block per rank)."""
    n = count * nranks if collective == "reduce_scatter" else count
    i = np.arange(n, dtype=np.int64)
    return ((i * 3 + rank * 11 + 1) % 101).astype(DTYPE)


def expected(collective: str, nranks: int, count: int, rank: int = 0) -> np.ndarray:
    """What ``rank`` holds after the call (the same on every rank but reduce_scatter's)."""
    sends = [send_data(collective, r, count, nranks) for r in range(nranks)]
    if collective == "allgather":
        return np.concatenate(sends)
    if collective == "allreduce":
        return np.sum(sends, axis=0, dtype=DTYPE)
    if collective == "broadcast":
        return sends[ROOT]
    if collective == "reduce_scatter":
        return np.sum(sends, axis=0, dtype=DTYPE)[rank * count:(rank + 1) * count]
    raise ValueError(f"unknown collective {collective!r}; valid: {', '.join(COLLECTIVES)}")


def measure(case: Case, rank: int, nranks: int, prepare, barrier, max_over_ranks,
            min_over_ranks, warmup: int) -> Measured:
    """Time one case on this rank; every rank must call it with the same arguments.

    ``prepare(case) -> (call, result, reset)``: ``call()`` runs the collective once on
    preallocated buffers, ``result()`` returns this rank's output as a numpy array and
    ``reset()`` fills the output with a sentinel (the buffers start filled with it).
    ``barrier()``, ``max_over_ranks(x)`` and ``min_over_ranks(x)`` are the peer's own.
    """
    call, result, reset = prepare(case)
    want = expected(case.collective, nranks, case.count, rank)
    call()
    ok_first = bool(np.array_equal(result(), want))
    for _ in range(warmup):
        call()
    iters = max(1, case.iters)
    reset()                  # the last timed call must write the output afresh
    barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    mean = (time.perf_counter() - t0) / iters
    ok_last = bool(np.array_equal(result(), want))
    seconds = max_over_ranks(mean)
    ok = min_over_ranks(1.0 if ok_first and ok_last else 0.0) == 1.0
    detail = "" if ok else (f"rank {rank}: first call {'ok' if ok_first else 'WRONG'}, "
                            f"last call {'ok' if ok_last else 'WRONG'}")
    return Measured(case.collective, case.count, case.nbytes, np.dtype(DTYPE).name, iters,
                    warmup, seconds * 1e6, ok, detail)


def load_plan(text: str) -> tuple[list[Case], int]:
    """The worker's argument: ``{"cases": [...], "warmup": W}`` as JSON."""
    plan = json.loads(text)
    return [Case(**c) for c in plan["cases"]], int(plan["warmup"])


def dump_plan(cases: list[Case], warmup: int) -> str:
    return json.dumps({"cases": [asdict(c) for c in cases], "warmup": warmup})


def append_row(path: str, row: Measured, **extra) -> None:
    """One JSON line per finished case, flushed at once: a run killed on timeout keeps the
    rows it finished."""
    with open(path, "a") as f:
        f.write(json.dumps({**asdict(row), **extra}) + "\n")
