"""The offload process's side of its multicast receive workers (:mod:`.worker`).

* :class:`RootSenderIO`: the drivers' multicast I/O when workers receive: each rank sends
  its streams to its own root group (``group_for(job, comm, root)``) and reads nothing.
* :class:`Workers`: starts the worker processes (``POLYCAST_OFFLOAD_WORKERS``), tells them
  the job (SETUP), the ranks' arenas (MAP) and the groups of the roots each owns (JOIN:
  root ``r`` of a communicator belongs to worker ``r % k``), turns the engines' OpenStream,
  StreamData and CloseStream actions into commands for the owning worker, and hands the
  workers' progress reports to the engines (``Driver.engine_event``). A worker that dies
  takes the offload process with it (every rank then raises OffloadLost): its streams
  would otherwise only ever time out.
"""

from __future__ import annotations

import array
import itertools
import json
import os
import selectors
import socket
import subprocess
import sys
import threading
import time

from ...engine.actions import CloseStream, OpenStream, StreamData
from ...errors import PolycastError
from ...schedule.ir import Kind
from ..driver.datagrams import MulticastIO, _Group
from ..transport.mcast import MulticastUnavailable, open_sender
from ..transport.shm import Ring
from . import descriptors as D
from .arena import shm_path
from .channel import RING_NBYTES, Channel

ANSWER_SECONDS = 10.0           # a worker answers a command (MAP, SETUP, STATS) within this
STOP_SECONDS = 2.0


class RootSenderIO(MulticastIO):
    """Send-only multicast on one group per root (the workers receive); ``native``: send
    streams with the compiled helper (as the workers place with it)."""

    def __init__(self, sel, on_datagram, cfg=None, placer=None, on_progress=None,
                 native: bool = False) -> None:
        super().__init__(sel, on_datagram, cfg, placer, on_progress, send_chunks=native)

    def open(self, comm_id: int, job_id: str, single_host: bool, own_rank: int) -> str | None:
        try:
            sock, addr = open_sender(job_id, comm_id, own_rank, single_host, self._interface)
        except MulticastUnavailable as exc:
            return str(exc)
        # registered like a group socket: MulticastIO flips write interest when blocked
        self._sel.register(sock, selectors.EVENT_READ, ("mcast", comm_id))
        self._groups[comm_id] = _Group(sock, addr)
        return None


class _Proc:
    __slots__ = ("index", "popen", "channel", "pid")

    def __init__(self, index, popen, channel) -> None:
        self.index, self.popen, self.channel, self.pid = index, popen, channel, popen.pid


class Workers:
    def __init__(self, count: int, dgram: bool = True) -> None:
        self.k = count
        self.dgram = dgram              # the workers place with the compiled helper
        self.procs: list[_Proc] = []
        self.hosts: dict[int, object] = {}          # world rank -> RankHost
        self._tokens = itertools.count(1)
        self._answers: dict[int, list] = {}
        self._cv = threading.Condition()
        self._closes: dict[int, tuple] = {}        # token -> (host, req)
        self._comms: dict[int, int] = {}            # comm -> local ranks that joined
        self._expected: dict[tuple, int] = {}       # (id(sched), root, ordinal, locals)
        self._setup_done = False
        self._lock = threading.Lock()
        self.stopping = False
        self.sel = selectors.DefaultSelector()
        for i in range(count):
            self.procs.append(self._start(i))
        self._thread = threading.Thread(target=self._reports, daemon=True,
                                        name="polycast-offload-workers")
        self._thread.start()

    def _start(self, index: int) -> _Proc:
        mine, theirs = socket.socketpair()
        cmd = Ring.create(shm_path("wcmd"), RING_NBYTES)
        rep = Ring.create(shm_path("wrep"), RING_NBYTES)
        try:
            popen = subprocess.Popen(
                [sys.executable, "-m", "polycast.runtime.offload.worker"],
                stdin=subprocess.PIPE, pass_fds=(theirs.fileno(),))
            popen.stdin.write(json.dumps({
                "index": index, "count": self.k, "fd": theirs.fileno(), "cmd": cmd.path,
                "report": rep.path, "ring_nbytes": RING_NBYTES,
                "dgram": self.dgram}).encode() + b"\n")
            popen.stdin.close()
        finally:
            theirs.close()
        proc = _Proc(index, popen, Channel(mine, cmd, rep))
        self.sel.register(mine, selectors.EVENT_READ, proc)
        # the first answer proves the worker mapped both rings: unlink them then
        try:
            self._ask(proc, D.w_token(D.W_STATS, self._token_for_answer()), b"")
        finally:
            cmd.unlink()
            rep.unlink()
        return proc

    # -- asking ---------------------------------------------------------------------------
    def _token_for_answer(self) -> int:
        token = next(self._tokens)
        with self._cv:
            self._answers[token] = []
        return token

    def _ask(self, proc: _Proc, blob: bytes, payload: bytes):
        token = D.parse_w_token(blob)
        with self._cv:
            self._answers.setdefault(token, [])
        proc.channel.send(blob, payload)
        deadline = time.monotonic() + ANSWER_SECONDS
        if not self._thread_started():
            self._pump_until(proc, token, deadline)
        with self._cv:
            while not self._answers[token]:
                left = deadline - time.monotonic()
                if left <= 0 or proc.popen.poll() is not None:
                    del self._answers[token]
                    raise PolycastError(f"offload receive worker {proc.index} (pid "
                                        f"{proc.pid}) did not answer")
                self._cv.wait(min(left, 0.05))
            return self._answers.pop(token)[0]

    def _thread_started(self) -> bool:
        return getattr(self, "_thread", None) is not None and self._thread.is_alive()

    def _pump_until(self, proc: _Proc, token: int, deadline: float) -> None:
        """Before the report thread runs (while starting): read answers here."""
        while time.monotonic() < deadline and proc.popen.poll() is None:
            self.sel.select(0.002)
            if proc.channel.pending():
                self._read(proc)
            with self._cv:
                if self._answers.get(token):
                    return

    def ask_all(self, kind: int, payload: bytes = b"") -> list:
        return [self._ask(p, D.w_token(kind, self._token_for_answer()), payload)
                for p in self.procs]

    # -- what the offload process tells them ----------------------------------------------
    def setup(self, job_id: str, single_host: bool, key: bytes | None) -> None:
        with self._lock:
            if self._setup_done:
                return
            self.ask_all(D.W_SETUP, json.dumps({"job_id": job_id, "single_host": single_host,
                                                "key": key.hex() if key else ""}).encode())
            self._setup_done = True

    def map_arena(self, rank: int, path: str, nbytes: int) -> None:
        self.ask_all(D.W_MAP, json.dumps({"rank": rank, "path": path,
                                          "nbytes": nbytes}).encode())

    def join(self, comm: int, nmembers: int) -> None:
        with self._lock:
            self._comms[comm] = self._comms.get(comm, 0) + 1
            if self._comms[comm] > 1:
                return
        for p in self.procs:
            roots = [r for r in range(nmembers) if r % self.k == p.index]
            if roots:
                p.channel.send(D.w_comm(D.W_JOIN, comm), json.dumps(roots).encode())

    def leave(self, comm: int) -> None:
        with self._lock:
            n = self._comms.get(comm, 0) - 1
            if n > 0:
                self._comms[comm] = n
                return
            self._comms.pop(comm, None)
        for p in self.procs:
            p.channel.send(D.w_comm(D.W_LEAVE, comm))

    def stats(self) -> list:
        answers = self.ask_all(D.W_STATS)
        return [json.loads(a) for a in answers]

    # -- engine actions (a rank's driver, progress lock held) -----------------------------
    def on_action(self, host, cs, a) -> None:
        t = type(a)
        if t is OpenStream:
            self._open(host, cs, a)
        elif t is StreamData:
            key = (cs.id, a.seq, a.root, a.ordinal)
            self._owner(a.root).channel.send(D.w_data(host.rank, key, a.offset),
                                             bytes(memoryview(a.payload).cast("B")))
        elif t is CloseStream:
            token = next(self._tokens)
            self._closes[token] = (host, a.req)
            host.closing_stream(a.req)
            key = (cs.id, a.seq, a.root, a.ordinal)
            self._owner(a.root).channel.send(D.w_close(host.rank, key, token))

    def _owner(self, root: int) -> _Proc:
        return self.procs[root % self.k]

    def _open(self, host, cs, a: OpenStream) -> None:
        post = host.posted.get(a.region.req)
        base = None if post is None else post.offsets.get(a.region.buf)
        if base is None:
            host.driver.runner.fail_request(a.region.req, PolycastError(
                f"rank {host.rank}: the offload's receive workers place multicast chunks "
                f"only into send/recv buffers, and this schedule receives into "
                f"{a.region.buf!r}; use POLYCAST_OFFLOAD_WORKERS=0"))
            return
        local = tuple(i for i, w in enumerate(cs.members) if w in host.local_ranks)
        ekey = (id(post.sched), a.root, a.ordinal, local)
        expected = self._expected.get(ekey)
        if expected is None:
            progs = post.sched.programs
            expected = sum(1 for c in local if any(
                st.kind is Kind.MRECV and st.peer == a.root and st.tag == a.ordinal
                for st in progs[c]))
            if len(self._expected) > 4096:
                self._expected.clear()
            self._expected[ekey] = expected
        reg = a.region
        runs = array.array("q", [x for run in reg.runs for x in run]).tobytes()
        isz = reg.nbytes // max(1, reg.nelems)
        self._owner(a.root).channel.send(
            D.w_open(host.rank, (cs.id, a.seq, a.root, a.ordinal), a.sig, isz, a.chunk_elems,
                     a.nchunks, max(1, expected), reg.nelems, base), runs)

    # -- reports (this module's thread) ---------------------------------------------------
    def _reports(self) -> None:
        try:
            while not self.stopping:
                for key, _ in self._select():
                    self._read(key.data)
                for p in self.procs:
                    if p.channel.pending():
                        self._read(p)
        except Exception as exc:            # noqa: BLE001 - fatal: say so, then go
            if not self.stopping:
                print(f"polycast offload: receive workers failed: {exc!r}", file=sys.stderr,
                      flush=True)
                os._exit(3)

    def _select(self) -> list:
        rings = [p.channel.ring_in for p in self.procs]
        for ring in rings:
            ring.set_sleeping(True)
        try:
            if any(ring.pending_input() for ring in rings):
                return self.sel.select(0)
            return self.sel.select(0.05)
        finally:
            for ring in rings:
                ring.set_sleeping(False)

    def _read(self, p: _Proc) -> None:
        ch = p.channel
        if not ch.drain_socket() and not self.stopping:
            raise PolycastError(f"receive worker {p.index} (pid {p.pid}) exited (status "
                                f"{p.popen.poll()})")
        ch.flush()
        for blob, payload in ch.poll(256):
            kind = D.kind_of(blob)
            if kind == D.W_PROGRESS:
                self._progress(*D.parse_w_progress(blob), payload)
            elif kind == D.W_ACK:
                token = D.parse_w_token(blob)
                ent = self._closes.pop(token, None)
                if ent is not None:
                    ent[0].stream_closed(ent[1])
                else:
                    self._answer(token, b"")
            elif kind == D.W_STATS:
                self._answer(D.parse_w_token(blob), payload)

    def _answer(self, token: int, payload: bytes) -> None:
        with self._cv:
            box = self._answers.get(token)
            if box is not None:
                box.append(payload)
                self._cv.notify_all()

    def _progress(self, rank: int, key: tuple, flags: int, payload: bytes) -> None:
        host = self.hosts.get(rank)
        if host is None or host.driver is None:
            return
        flat = array.array("I")
        flat.frombytes(payload)
        ranges = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
        comm, seq, root, ordinal = key
        eos, rec = bool(flags & D.F_EOS), bool(flags & D.F_RECOVERED)
        host.driver.engine_event(comm, lambda eng, now: eng.on_stream_progress(
            seq, root, ordinal, ranges, now, eos=eos, recovered=rec))

    # -- ending -----------------------------------------------------------------------------
    def stop(self) -> None:
        self.stopping = True
        for p in self.procs:
            p.channel.send(D.w_token(D.W_STOP))
        deadline = time.monotonic() + STOP_SECONDS
        for p in self.procs:
            try:
                p.popen.wait(max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()              # by pid: only the workers we started
                p.popen.wait(STOP_SECONDS)
            p.channel.close()
