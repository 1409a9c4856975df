"""Start N local ranks of a Python script: ``polycast run -n 4 script.py ARGS``.

Each rank gets the POLYCAST_* environment (see :mod:`polycast.runtime.bootstrap.env`) and, so that
``torch.distributed.init_process_group`` works too, torch's RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (a port of its own: torch's rank 0 serves
its TCPStore there). Its output is forwarded with a ``[rank N]`` prefix (stdout to
stdout, stderr to stderr).

How a job ends:

* every rank exits 0: status 0;
* a rank fails: the launcher names the rank that failed *first* — the one whose failure was
  not a consequence of another's (ranks report that through
  :mod:`polycast.runtime.bootstrap.report`: a rank that raised PeerLost naming rank 2 is a
  consequence of rank 2) — ends the others and exits with that rank's status (128 + signal
  for a rank killed by a signal). Only the cause prints a full traceback;
* ``--timeout S``: after S seconds the ranks still running are ended (each first prints
  every thread's stack, so the output says where it was) and the status is 124;
* a rank still running ``--straggler-timeout`` seconds (default: the job's
  POLYCAST_TIMEOUT, 60 s) after every other rank exited 0 is ended the same way (status
  124): it can no longer be waiting for a peer;
* the launcher itself dies (SIGKILL included): its ranks die with it (Linux
  ``PR_SET_PDEATHSIG``); on SIGTERM, SIGHUP or Ctrl-C it ends them (status 128 + signal).

Ranks run in their own process group, ended with SIGTERM and, after a grace period,
SIGKILL — only the processes this launcher started.

Also runnable as ``python -m polycast.tools.launch -n 4 script.py ARGS``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from ..errors import InvalidArgument
from ..runtime.bootstrap import auth, report

GRACE_SECONDS = 3.0
SETTLE_SECONDS = 2.0        # after a failure, how long the others may take to fail too
STACK_DUMP_SECONDS = 0.5    # between SIGUSR1 (stack dump) and SIGTERM on a timeout
TIMEOUT_STATUS = 124


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel just said is free (another process could still take it first;
    the store then fails with a clear PortInUse error)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rank_env(rank: int, nranks: int, port: int, job_id: str, base: dict | None = None,
             extra: dict | None = None, torch_port: int | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    if torch_port is not None:
        env.update({"RANK": str(rank), "WORLD_SIZE": str(nranks), "LOCAL_RANK": str(rank),
                    "LOCAL_WORLD_SIZE": str(nranks), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(torch_port)})
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
    exited_at: float | None = None      # monotonic time the launcher saw it exit
    ended_by_us: bool = False


def _forward(stream, out, prefix: bytes, lock: threading.Lock) -> None:
    """Copy a rank's pipe to ``out`` with ``prefix`` on every line. Whatever one read
    returns is written under the lock at once, so a traceback the rank wrote in one piece
    is not interleaved with other ranks' lines. Binary lines: invalid UTF-8 is fine."""
    fd = stream.fileno()
    broken, tail = False, b""
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except OSError:
            data = b""
        if not data:
            break
        if broken:
            continue            # keep draining, or the rank would block on a full pipe
        lines = (tail + data).split(b"\n")
        tail = lines.pop()
        if lines:
            broken = _write_lines(out, prefix, lines, lock)
    if tail and not broken:
        _write_lines(out, prefix, [tail], lock)
    stream.close()


def _write_lines(out, prefix: bytes, lines: list[bytes], lock: threading.Lock) -> bool:
    """Write ``lines`` (without newlines), one write each; True if the reader went away."""
    with lock:
        try:
            for line in lines:
                out.write(prefix + line + b"\n")
            out.flush()
        except (BrokenPipeError, ValueError, OSError):
            return True         # our reader went away (`polycast run ... | head`)
    return False


def _exit_status(code: int) -> int:
    return 128 - code if code < 0 else code


def _describe_code(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (status {128 - code})"
    return f"exited with status {code}"


def _die_with_parent():
    """A preexec_fn: the rank gets SIGKILL when the launcher dies (Linux), and does not
    start at all if the launcher is already gone."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, signal.SIGKILL, 0, 0, 0)       # PR_SET_PDEATHSIG = 1
        if os.getppid() != parent:
            os._exit(1)
    return preexec


def _stoppable(signals=(signal.SIGTERM, signal.SIGHUP)):
    """Turn SIGTERM/SIGHUP into an exception in the launcher (main thread only), so it ends
    its ranks before it goes; returns a function restoring the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {}

    def handler(signum, frame):
        raise _Stopped(signum)
    for sig in signals:
        try:
            previous[sig] = signal.signal(sig, handler)
        except (ValueError, OSError):
            pass

    def restore() -> None:
        for sig, h in previous.items():
            signal.signal(sig, h)
    return restore


class _Stopped(Exception):
    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def check_arguments(nranks: int, command: list[str], timeout_seconds: float | None,
                    straggler_seconds: float | None, extra_env: dict | None = None,
                    script: bool = True) -> float:
    """Raise InvalidArgument for a job that cannot start; return the straggler timeout.
    ``script``: ``command`` is a Python script path (or ``-m module``) that must exist."""
    if not isinstance(nranks, int) or nranks < 1:
        raise InvalidArgument(f"number of ranks must be a positive integer, got {nranks!r}")
    if not command or command[0] == "-m" and len(command) < 2:
        raise InvalidArgument("nothing to run: give a script (and its arguments) or -m module")
    if timeout_seconds is not None and timeout_seconds <= 0:
        raise InvalidArgument(f"--timeout must be > 0 seconds, got {timeout_seconds:g}")
    if straggler_seconds is None:
        from ..runtime.bootstrap.env import timeout_from_env
        straggler_seconds = timeout_from_env({**os.environ, **(extra_env or {})})
    if straggler_seconds < 0:
        raise InvalidArgument(f"--straggler-timeout must be >= 0 seconds (0: no limit), got "
                              f"{straggler_seconds:g}")
    if script and command[0] != "-m" and not os.path.isfile(command[0]):
        raise InvalidArgument(f"script {command[0]!r} not found")
    return straggler_seconds


def launch(nranks: int, command: list[str], *, port: int | None = None,
           timeout_seconds: float | None = None, straggler_seconds: float | None = None,
           extra_env: dict | None = None, prefix: bool = True, stdout=None,
           stderr=None, argv_for=None, env_for=None) -> int:
    """Run ``command`` (an argv list; the first item a Python script path or ``-m module``)
    as ``nranks`` local ranks; return the job's exit status (see the module docstring).

    ``argv_for(rank)``, when given, is the whole argv of that rank instead (``polycast lab
    run`` runs each rank's command in its host's namespace, ``ip netns exec HOST ...``);
    ``env_for(rank)``, when given, is a dict of variables that rank gets on top of (and over)
    the usual ones (``lab run``: its local rank and size, the master's address).
    ``timeout_seconds``: end the whole job after this long (None: no limit).
    ``straggler_seconds``: end ranks still running this long after all others exited 0
    (None: the job's POLYCAST_TIMEOUT; 0: no limit)."""
    straggler_seconds = check_arguments(nranks, command, timeout_seconds, straggler_seconds,
                                        extra_env, script=argv_for is None)
    out = stdout if stdout is not None else sys.stdout.buffer
    err = stderr if stderr is not None else sys.stderr.buffer
    port = port or free_port()
    torch_port = free_port()
    while torch_port == port:
        torch_port = free_port()
    job_id = secrets.token_hex(6)
    argv = [sys.executable] + list(command)
    lock = threading.Lock()
    ranks: list[_Rank] = []
    reports = tempfile.mkdtemp(prefix="polycast-run-")
    extra = {report.ENV: reports, **(extra_env or {})}
    preexec = _die_with_parent()
    restore = _stoppable()
    status = 1
    try:
        for r in range(nranks):
            proc = subprocess.Popen(argv_for(r) if argv_for else argv,
                                    env=rank_env(r, nranks, port, job_id,
                                                 extra={**extra, **(env_for(r) if env_for
                                                                    else {})},
                                                 torch_port=torch_port),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, process_group=0,
                                    preexec_fn=preexec)
            item = _Rank(r, proc)
            pre = f"[rank {r}] ".encode() if prefix else b""
            for stream, sink in ((proc.stdout, out), (proc.stderr, err)):
                t = threading.Thread(target=_forward, args=(stream, sink, pre, lock),
                                     daemon=True)
                t.start()
                item.threads.append(t)
            ranks.append(item)
        status = _Supervisor(ranks, reports, err, lock).run(timeout_seconds,
                                                             straggler_seconds)
    except (KeyboardInterrupt, _Stopped) as exc:
        signum = exc.signum if isinstance(exc, _Stopped) else signal.SIGINT
        _say(err, lock, f"{signal.Signals(signum).name}: ending all ranks")
        status = 128 + int(signum)
    finally:
        restore()
        _end_all(ranks)
        for item in ranks:
            for t in item.threads:
                t.join(timeout=GRACE_SECONDS)
        shutil.rmtree(reports, ignore_errors=True)
    return status


def _say(err, lock: threading.Lock, text: str) -> None:
    with lock:
        try:
            err.write(f"polycast run: {text}\n".encode())
            err.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass


def _ranks_text(rs) -> str:
    rs = sorted(rs)
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


class _Supervisor:
    """Watches the ranks and decides how the job ends (see the module docstring)."""

    def __init__(self, ranks: list[_Rank], reports: str, err, lock) -> None:
        self.ranks, self.reports, self.err, self.lock = ranks, reports, err, lock

    def _poll(self) -> None:
        now = time.monotonic()
        for item in self.ranks:
            if item.exited_at is None and item.proc.poll() is not None:
                item.exited_at = now

    def _running(self) -> list[_Rank]:
        return [i for i in self.ranks if i.exited_at is None]

    def _failed(self) -> list[_Rank]:
        return [i for i in self.ranks if i.exited_at is not None and i.proc.returncode != 0
                and not i.ended_by_us]

    def run(self, timeout_seconds: float | None, straggler_seconds: float) -> int:
        start = time.monotonic()
        all_ok_since = None
        while True:
            self._poll()
            running = self._running()
            failed = self._failed()
            if failed:
                return self._failure(failed)
            if not running:
                return 0
            now = time.monotonic()
            if timeout_seconds is not None and now - start > timeout_seconds:
                done = [i.rank for i in self.ranks if i.exited_at is not None]
                self._end_stuck(running, f"--timeout {timeout_seconds:g} s reached: ending "
                                f"{_ranks_text(i.rank for i in running)}, still running"
                                + (f" ({_ranks_text(done)} had finished)" if done else ""))
                return TIMEOUT_STATUS
            if len(running) < len(self.ranks):
                all_ok_since = all_ok_since or now
                if straggler_seconds and now - all_ok_since > straggler_seconds:
                    done = [i.rank for i in self.ranks if i.exited_at is not None]
                    self._end_stuck(running, f"{_ranks_text(done)} finished "
                                    f"{straggler_seconds:g} s ago but "
                                    f"{_ranks_text(i.rank for i in running)} "
                                    f"{'is' if len(running) == 1 else 'are'} still running "
                                    "(not in a collective with them, so nothing will end "
                                    "it): ending it (--straggler-timeout; 0 waits forever)")
                    return TIMEOUT_STATUS
            time.sleep(0.02)

    def _end_stuck(self, running: list[_Rank], message: str) -> None:
        _say(self.err, self.lock, message)
        self._dump_stacks(running)
        for item in running:
            item.ended_by_us = True
        _end_all(self.ranks)

    def _dump_stacks(self, running: list[_Rank]) -> None:
        """Have ranks that installed the handler (report.install) print every thread's
        stack to their stderr (forwarded with their prefix), so a rank the launcher ends
        says where it was."""
        dumping = [i for i in running
                   if os.path.exists(report.dump_marker(self.reports, i.rank))]
        for item in dumping:
            try:
                os.kill(item.proc.pid, signal.SIGUSR1)  # the rank only, not its children
            except ProcessLookupError:
                pass
        if dumping:
            time.sleep(STACK_DUMP_SECONDS)

    def _failure(self, failed: list[_Rank]) -> int:
        """Someone failed. Wait briefly for the others to fail too (the cause, if only
        consequences exited yet; and the survivors' own errors, which name the cause),
        end the rest, and name the cause."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while self._running() and time.monotonic() < deadline:
            time.sleep(0.02)
            self._poll()
        still = self._running()
        stopped = {i.rank: report.process_state(i.proc.pid) for i in still}
        # A running rank that has not failed within the settle time after a peer did is
        # waiting for something the failure should have ended: say where (its stacks), so
        # such a failure explains itself (a stopped rank cannot answer).
        silent = [i for i in still if not (stopped[i.rank] and "stopped" in stopped[i.rank])]
        if silent:
            _say(self.err, self.lock,
                 f"{_ranks_text(i.rank for i in silent)} still running {SETTLE_SECONDS:g} s "
                 f"after {_ranks_text(i.rank for i in failed)} failed: stacks follow")
            self._dump_stacks(silent)
        for item in still:
            item.ended_by_us = True
        _end_all(self.ranks)
        for r, state in sorted(stopped.items()):
            if state and "stopped" in state:    # what the others waited for, most likely
                _say(self.err, self.lock, f"rank {r} {state} while the others failed")
        failed = self._failed()
        causes = self._causes(failed)
        reports = {i.rank: report.read_report(self.reports, i.rank) for i in failed}
        if causes:
            first = min(causes, key=lambda i: (self._when(i, reports), i.rank))
        else:
            # Only consequences exited: blame the rank they lost (it hung or stopped).
            lost = {reports[i.rank]["consequence_of"] for i in failed}
            first = min(failed, key=lambda i: (self._when(i, reports), i.rank))
            blamed = sorted(r for r in lost if r is not None and 0 <= r < len(self.ranks))
            states = []
            for r in blamed:
                item = self.ranks[r]
                states.append(f"rank {r} " + ("was still running (ended)" if item in still
                                              else "had exited with status 0" if
                                              item.proc.returncode == 0 else "had exited"))
            _say(self.err, self.lock,
                 f"{_ranks_text(i.rank for i in failed)} failed because they lost "
                 f"{_ranks_text(blamed)}: " + "; ".join(states)
                 + (f"; ended {_ranks_text(i.rank for i in still)}" if still else ""))
            return _exit_status(first.proc.returncode)
        rep = reports.get(first.rank)
        what = _describe_code(first.proc.returncode) + (f" ({rep['error']})" if rep else "")
        others = [i.rank for i in failed if i is not first]
        tail = []
        if others:
            tail.append(f"then {_ranks_text(others)} failed too")
        if still:
            tail.append(f"ended {_ranks_text(i.rank for i in still)}")
        _say(self.err, self.lock, f"rank {first.rank} failed first: it {what}"
             + ("; " + ", ".join(tail) if tail else ""))
        return _exit_status(first.proc.returncode)

    def _causes(self, failed: list[_Rank]) -> list[_Rank]:
        out = []
        for item in failed:
            rep = report.read_report(self.reports, item.rank)
            if rep is None or rep.get("consequence_of") is None:
                out.append(item)
        return out

    @staticmethod
    def _when(item: _Rank, reports: dict) -> float:
        rep = reports.get(item.rank)
        # Reports carry wall time when the exception reached the top; ranks without one
        # are ordered by when the launcher saw them exit, on the same clock.
        if rep is not None:
            return rep["time"]
        return time.time() - (time.monotonic() - item.exited_at)


def _signal_group(item: _Rank, sig: int) -> None:
    """Signal the rank's process group (the rank and what it started), while the rank has
    not been reaped (so the group id is still ours)."""
    if item.proc.poll() is not None:
        return
    try:
        os.killpg(item.proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _end_all(ranks: list[_Rank]) -> None:
    """SIGTERM every still-running rank this launcher started, SIGKILL after the grace."""
    running = [item for item in ranks if item.proc.poll() is None]
    for item in running:
        _signal_group(item, signal.SIGTERM)
        _signal_group(item, signal.SIGCONT)     # a stopped rank acts on it at once
    deadline = time.monotonic() + GRACE_SECONDS
    for item in running:
        try:
            item.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(item, signal.SIGKILL)
            item.proc.kill()
            item.proc.wait(timeout=GRACE_SECONDS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--nranks", type=int, required=True, help="number of local ranks")
    parser.add_argument("--port", type=int, default=0,
                        help="rendezvous port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="end the whole job after this many seconds, printing where "
                             "each rank still running was (status 124; default: no limit)")
    parser.add_argument("--straggler-timeout", type=float, default=None,
                        help="end a rank still running this many seconds after every other "
                             "rank exited 0 (status 124; default: POLYCAST_TIMEOUT, 60 s; "
                             "0: no limit)")
    parser.add_argument("--transport", choices=("auto", "shm", "tcp"), default=None,
                        help="force the point-to-point transport (sets POLYCAST_TRANSPORT)")
    parser.add_argument("--secret", action="store_true",
                        help="give the ranks a fresh random job secret (POLYCAST_SECRET): "
                             "the store and ranks refuse outsiders and every message and "
                             "datagram carries a MAC; a POLYCAST_SECRET already set is kept")
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
    if args.secret and not os.environ.get(auth.ENV):
        extra[auth.ENV] = auth.new_secret()
    command = (["-m", *args.module] if args.module else []) + list(args.command)
    check_arguments(args.nranks, command, args.timeout, args.straggler_timeout, extra)
    return launch(args.nranks, command, port=args.port or None,
                  timeout_seconds=args.timeout, straggler_seconds=args.straggler_timeout,
                  extra_env=extra, prefix=not args.no_prefix)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polycast.tools.launch",
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
