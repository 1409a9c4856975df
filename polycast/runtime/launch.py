"""Start N local ranks of a Python script: ``polycast run -n 4 script.py ARGS``.

Each rank gets the POLYCAST_* environment (see :mod:`polycast.runtime.env`), its output is
forwarded line by line with a ``[rank N]`` prefix (stdout to stdout, stderr to stderr),
and when one rank fails the others are ended (SIGTERM, then SIGKILL after a grace period;
only the processes this launcher started, by pid). The launcher exits with the status of
the first rank that failed (128 + signal for a rank killed by a signal), else 0.

Also runnable as ``python -m polycast.runtime.launch -n 4 script.py ARGS``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from ..errors import InvalidArgument

GRACE_SECONDS = 3.0


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel just said is free (another process could still take it first;
    the store then fails with a clear PortInUse error)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rank_env(rank: int, nranks: int, port: int, job_id: str, base: dict | None = None,
             extra: dict | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update({
        "POLYCAST_RANK": str(rank), "POLYCAST_SIZE": str(nranks),
        "POLYCAST_LOCAL_RANK": str(rank), "POLYCAST_LOCAL_SIZE": str(nranks),
        "POLYCAST_MASTER_ADDR": "127.0.0.1", "POLYCAST_MASTER_PORT": str(port),
        "POLYCAST_JOB_ID": job_id, "PYTHONUNBUFFERED": "1",
    })
    env.update(extra or {})
    return env


@dataclass
class _Rank:
    rank: int
    proc: subprocess.Popen
    threads: list[threading.Thread] = field(default_factory=list)


def _forward(stream, out, prefix: bytes, lock: threading.Lock) -> None:
    # Binary lines: a rank printing invalid UTF-8 must not kill the forwarder.
    broken = False
    for line in iter(stream.readline, b""):
        if broken:
            continue            # keep draining, or the rank would block on a full pipe
        if not line.endswith(b"\n"):
            line += b"\n"
        with lock:
            try:
                out.write(prefix + line)
                out.flush()
            except (BrokenPipeError, ValueError, OSError):
                broken = True   # our reader went away (`polycast run ... | head`)
    stream.close()


def _exit_status(code: int) -> int:
    return 128 - code if code < 0 else code


def launch(nranks: int, command: list[str], *, port: int | None = None,
           timeout_seconds: float | None = None, extra_env: dict | None = None,
           prefix: bool = True, stdout=None, stderr=None) -> int:
    """Run ``command`` (an argv list; the first item a Python script path or ``-m module``)
    as ``nranks`` local ranks; return the job's exit status."""
    if not isinstance(nranks, int) or nranks < 1:
        raise InvalidArgument(f"number of ranks must be a positive integer, got {nranks!r}")
    if not command:
        raise InvalidArgument("nothing to run: give a script (and its arguments) or -m module")
    if timeout_seconds is not None and timeout_seconds <= 0:
        raise InvalidArgument(f"timeout must be > 0 seconds, got {timeout_seconds}")
    out = stdout if stdout is not None else sys.stdout.buffer
    err = stderr if stderr is not None else sys.stderr.buffer
    port = port or free_port()
    job_id = secrets.token_hex(6)
    argv = [sys.executable] + list(command)
    lock = threading.Lock()
    ranks: list[_Rank] = []
    try:
        for r in range(nranks):
            proc = subprocess.Popen(argv, env=rank_env(r, nranks, port, job_id, extra=extra_env),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
            item = _Rank(r, proc)
            pre = f"[rank {r}] ".encode() if prefix else b""
            for stream, sink in ((proc.stdout, out), (proc.stderr, err)):
                t = threading.Thread(target=_forward, args=(stream, sink, pre, lock),
                                     daemon=True)
                t.start()
                item.threads.append(t)
            ranks.append(item)
        status = _supervise(ranks, timeout_seconds, err, lock)
    except KeyboardInterrupt:
        _end_all(ranks)
        status = 130
    finally:
        _end_all(ranks)
        for item in ranks:
            for t in item.threads:
                t.join(timeout=GRACE_SECONDS)
    return status


def _supervise(ranks: list[_Rank], timeout_seconds: float | None, err, lock) -> int:
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    live = {item.rank: item for item in ranks}
    while live:
        for r, item in list(live.items()):
            code = item.proc.poll()
            if code is None:
                continue
            del live[r]
            if code != 0:
                with lock:
                    err.write(f"polycast run: rank {r} exited with status "
                              f"{_exit_status(code)}; ending the other ranks\n".encode())
                    err.flush()
                _end_all(ranks)
                return _exit_status(code)
        if deadline is not None and time.monotonic() > deadline:
            with lock:
                err.write(f"polycast run: job still running after {timeout_seconds:g} s; "
                          "ending all ranks\n".encode())
                err.flush()
            _end_all(ranks)
            return 124
        time.sleep(0.02)
    return 0


def _end_all(ranks: list[_Rank]) -> None:
    """SIGTERM every still-running rank this launcher started, SIGKILL after the grace."""
    running = [item.proc for item in ranks if item.proc.poll() is None]
    for proc in running:
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + GRACE_SECONDS
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=GRACE_SECONDS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--nranks", type=int, required=True, help="number of local ranks")
    parser.add_argument("--port", type=int, default=0,
                        help="rendezvous port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="end the whole job after this many seconds (default: no limit)")
    parser.add_argument("--transport", choices=("auto", "shm", "tcp"), default=None,
                        help="force the point-to-point transport (sets POLYCAST_TRANSPORT)")
    parser.add_argument("--no-prefix", action="store_true", help="do not prefix output lines")
    parser.add_argument("-m", dest="module", default=None, nargs=argparse.REMAINDER,
                        metavar="MODULE ARGS",
                        help="run a module (as python -m) with its arguments, instead of a "
                             "script")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="script.py [ARGS] (or the module's ARGS with -m)")


def run_from_args(args: argparse.Namespace) -> int:
    extra = {}
    if args.transport:
        extra["POLYCAST_TRANSPORT"] = args.transport
    command = (["-m", *args.module] if args.module else []) + list(args.command)
    return launch(args.nranks, command, port=args.port or None,
                  timeout_seconds=args.timeout, extra_env=extra, prefix=not args.no_prefix)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polycast.runtime.launch",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_from_args(args)
    except InvalidArgument as exc:
        print(f"polycast run: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
