"""``POLYCAST_DEBUG``: what ``auto`` chose, on stderr, as NCCL_DEBUG does.

* ``POLYCAST_DEBUG=INFO``: one line per (communicator, collective, size class) the first
  time a call of that class runs -- the algorithm, pipelining, estimate and why;
* ``POLYCAST_DEBUG=TRACE``: a line for every call;
* unset, ``WARN`` or anything else: nothing.

Lines are prefixed with the rank, ``[rank 3] polycast INFO allgather 1MiB..2MiB ...``, so
ranks' output can be told apart when a launcher merges it.
"""

from __future__ import annotations

import os
import sys
import threading

from .units import format_size

LEVELS = {"INFO": 1, "TRACE": 2}
_seen: set = set()
_lock = threading.Lock()


def level() -> int:
    return LEVELS.get(os.environ.get("POLYCAST_DEBUG", "").strip().upper(), 0)


def size_class(nbytes: int) -> str:
    """The power-of-two class of a size, as logged: ``[2^(k-1), 2^k)``."""
    if nbytes <= 0:
        return "0B"
    k = nbytes.bit_length()
    return f"{format_size(1 << (k - 1))}..{format_size(1 << k)}"


def log_choice(rank: int, comm_id: int, coll, nbytes: int, algorithm: str, nchunks: int,
               detail: str, lvl: int | None = None) -> None:
    """Log one call's choice at INFO (first of its class) or TRACE (every call)."""
    lvl = level() if lvl is None else lvl
    if not lvl:
        return
    key = (comm_id, str(coll), nbytes.bit_length() if nbytes > 0 else 0)
    with _lock:
        first = key not in _seen
        _seen.add(key)
    if lvl < 2 and not first:
        return
    tag = "INFO" if first else "TRACE"
    k = f" nchunks {nchunks}" if nchunks > 1 else ""
    size = size_class(nbytes) if first else format_size(nbytes)
    print(f"[rank {rank}] polycast {tag} comm {comm_id} {coll} {size}: {algorithm}{k}"
          + (f" ({detail})" if detail else ""), file=sys.stderr, flush=True)


def reset() -> None:
    """Forget what was logged (tests)."""
    with _lock:
        _seen.clear()
