"""``POLYCAST_DEBUG``: what polycast chose and why, on stderr, as NCCL_DEBUG does. The level
is the configuration's (``config.debug_level``: read once with the rest, then handed to
whoever logs).

* ``POLYCAST_DEBUG=INFO``: each set variable once (polycast.config), what a job set up
  (rings, single copy, symmetric memory), and one line per (communicator, collective, size
  class) the first time a call of that class runs -- the algorithm, pipelining, estimate
  and why;
* ``POLYCAST_DEBUG=TRACE``: a line for every call too;
* unset or ``WARN``: nothing.

Lines are prefixed with the rank, ``[rank 3] polycast INFO allgather 1MiB..2MiB ...``, so
ranks' output can be told apart when a launcher merges it.
"""

from __future__ import annotations

import sys
import threading

from .units import format_size

INFO, TRACE = 1, 2
_seen: set = set()
_lock = threading.Lock()


def info(rank: int, text: str) -> None:
    """One INFO line of rank ``rank`` (the caller checked the level)."""
    print(f"[rank {rank}] polycast INFO {text}", file=sys.stderr, flush=True)


def size_class(nbytes: int) -> str:
    """The power-of-two class of a size, as logged: ``[2^(k-1), 2^k)``."""
    if nbytes <= 0:
        return "0B"
    k = nbytes.bit_length()
    return f"{format_size(1 << (k - 1))}..{format_size(1 << k)}"


def log_choice(rank: int, comm_id: int, coll, nbytes: int, algorithm: str, nchunks: int,
               detail: str, lvl: int) -> None:
    """Log one call's choice at level ``lvl``: INFO (first of its class) or TRACE (every
    call)."""
    if not lvl:
        return
    key = (comm_id, str(coll), nbytes.bit_length() if nbytes > 0 else 0)
    with _lock:
        first = key not in _seen
        _seen.add(key)
    if lvl < TRACE and not first:
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
