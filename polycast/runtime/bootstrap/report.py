"""What a rank started by ``polycast run`` tells its launcher about how it ended.

When one rank fails, the others usually fail a moment later because of it (they raise
:class:`PeerLost` naming the rank that went away, or an error saying which rank aborted the
collective: ``PolycastError.caused_by``). The launcher can only see exit statuses,
and under load the consequences may exit before the cause. So each rank that dies of an
uncaught exception leaves a small JSON report in the directory named by
``POLYCAST_RUN_REPORT`` (set by the launcher): which exception, and whether it was a
*consequence* of another rank's failure (then which rank). The launcher blames the first
rank whose failure was not a consequence (a rank with no report, e.g. ``sys.exit(3)`` or
killed by a signal, is a cause) and prints that rank's traceback once: consequences print
one line each instead of a full traceback, so four tracebacks do not interleave.

Also, ``SIGUSR1`` dumps every thread's stack to stderr (:mod:`faulthandler`): the
launcher sends it to a rank it is about to end for a timeout, so the output says where the
rank was stuck.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
import traceback

ENV = "POLYCAST_RUN_REPORT"
_installed = False


def report_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank-{rank}.json")


def lost_rank(exc: BaseException) -> int | None:
    """The rank whose failure caused ``exc`` (``caused_by`` of a polycast error in it or its
    causes: a lost peer, or a rank that aborted the collective), or None."""
    from ...errors import PolycastError
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, PolycastError) and exc.caused_by is not None:
            return exc.caused_by
        exc = exc.__cause__ or exc.__context__
    return None


def describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def write_report(directory: str, rank: int, exc: BaseException) -> None:
    lost = lost_rank(exc)
    record = {"rank": rank, "time": time.time(), "error": describe(exc),
              "consequence_of": lost if lost != rank else None,
              "traceback": "".join(traceback.format_exception(exc))}
    tmp = report_path(directory, rank) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, report_path(directory, rank))


def read_report(directory: str, rank: int) -> dict | None:
    try:
        with open(report_path(directory, rank)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _hook(exc_type, exc, tb, _previous=sys.excepthook):
    directory, rank = os.environ.get(ENV), os.environ.get("POLYCAST_RANK", "")
    if not directory or not rank.isdigit() or not isinstance(exc, Exception):
        return _previous(exc_type, exc, tb)
    try:
        write_report(directory, int(rank), exc)
    except OSError:
        return _previous(exc_type, exc, tb)
    lost = lost_rank(exc)
    if lost is not None and lost != int(rank):
        # A consequence: one line, so the cause's traceback stays readable.
        sys.stderr.write(f"{describe(exc)} (a consequence of rank {lost}'s failure; "
                         "traceback in the launcher's report)\n")
        sys.stderr.flush()
        return None
    # One write, so the launcher forwards the traceback as one piece.
    sys.stderr.write("".join(traceback.format_exception(exc_type, exc, tb)))
    sys.stderr.flush()
    return None


def install() -> None:
    """Install the report hook and the SIGUSR1 stack dump (idempotent; main thread only
    for the signal)."""
    global _installed
    if _installed or not os.environ.get(ENV):
        return
    _installed = True
    sys.excepthook = _hook
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    except (AttributeError, ValueError, RuntimeError):      # no SIGUSR1 (Windows)
        return
    # Tell the launcher SIGUSR1 is safe now (without the handler it would kill us).
    rank = os.environ.get("POLYCAST_RANK", "")
    if rank.isdigit():
        try:
            open(dump_marker(os.environ[ENV], int(rank)), "w").close()
        except OSError:
            pass


def dump_marker(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank-{rank}.stacks")


def process_state(pid: int) -> str | None:
    """How a local process is, when that explains a silent rank: stopped, exited, or None
    (running, or not knowable here: no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "is not running" if os.path.isdir("/proc/self") else None
    if state in ("T", "t"):
        return "is stopped (SIGSTOP, SIGTSTP or a debugger)"
    if state in ("Z", "X"):
        return "has exited"
    return None
