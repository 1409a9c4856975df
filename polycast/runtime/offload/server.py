"""The offload process of one host: ``python -m polycast.runtime.offload.server`` (started
by the host's local rank 0, configuration on stdin; see :mod:`polycast.runtime.offload`).

The main thread serves every attached rank: it sleeps in ``select`` on the ranks' doorbell
sockets, reads their submission rings and hands each descriptor to that rank's
:class:`~polycast.runtime.driver.Driver` (the same driver in-process progress runs, one per
rank, each with its own progress thread). A request's end becomes a completion in the
rank's completion ring, written by whichever thread finished it. A rank attaches on a
thread of its own (the rendezvous blocks until every rank of the job is there), and
detaches with BYE (the driver closes in order, a thread of its own again) or by dying (its
connections are closed at once, without goodbye, so its peers see it lost).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import pickle
import selectors
import signal
import socket
import sys
import threading
import time
import traceback

import numpy as np

from ...config import current, load
from ...errors import PolycastError
from ..bootstrap.engine_config import engine_config
from ..driver import Driver
from ..driver.request import Request
from ..bootstrap.env import JobEnv
from ..transport.shm import Ring
from ..bootstrap.world import connect
from . import descriptors as D
from .arena import Arena
from .channel import Channel, peer_pid, recv_line, send_line
from .streams import RootSenderIO, Workers

SCHEDULES_KEPT = 512            # twice the ranks' table: ids a rank still uses are here
IDLE_SELECT_SECONDS = 0.05
CLOSE_SECONDS = 5.0


class HostRequest(Request):
    """A request posted on a rank's behalf: its end is a completion descriptor."""

    __slots__ = ("host",)

    def _finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self._done = True
        self.host.complete(self.req, error)


class RankHost:
    """One attached rank: its channel, arena, world, driver and schedules."""

    def __init__(self, server: "Server", sock: socket.socket, hello: dict) -> None:
        self.server = server
        self.sock = sock
        self.job = JobEnv(**hello["job"])
        self.rank = self.job.rank
        self.pid = hello["pid"]
        self.hello = hello
        self.arena = Arena(hello["arena"][0], hello["arena"][1], create=False)
        n = hello["ring_nbytes"]
        self.channel = Channel(sock, Ring.attach(hello["cq"], n), Ring.attach(hello["sq"], n))
        self.driver: Driver | None = None
        self.world = None
        self.schedules: collections.OrderedDict = collections.OrderedDict()
        self.gone = False
        self.workers = server.workers
        self.posted: dict[int, _Posted] = {}        # req -> what the workers need of it
        self.local_ranks: set[int] = set()
        self._lock = threading.Lock()
        self._closing: dict[int, int] = {}          # req -> CloseStreams not acknowledged
        self._parked: dict[int, BaseException] = {}  # failed reqs waiting for those acks

    # -- attaching ------------------------------------------------------------------------
    def connect(self) -> dict:
        """Rendezvous on the rank's behalf and start its driver; the rank's world answer."""
        h = self.hello
        w = self.workers
        if w is not None:               # before the rank unlinks its arena
            w.map_arena(self.rank, self.arena.path, self.arena.nbytes)
        # The rank's settings (read once by the rank, sent as variables) with the secret
        # this process was started with
        cfg = load(h.get("env") or {}, rank=self.rank).replace(
            "environment", secret=self.server.config.secret)
        self.world = world = connect(self.job, cfg)
        self.local_ranks = {r for r, p in world.peers.items() if p.same_host} | {self.rank}
        config = engine_config(world, cfg)
        if w is None:
            self.driver = Driver(world, config, cfg)
        else:
            w.setup(world.job_id, world.single_host, world.key)
            w.hosts[self.rank] = self
            self.driver = Driver(world, dataclasses.replace(config, external_streams=True),
                                 cfg, mcast_io=functools.partial(RootSenderIO, native=w.dgram),
                                 on_action=lambda cs, a: w.on_action(self, cs, a))
        err = self._add_comm(0, list(range(world.size)), True)
        return {"job_id": self.world.job_id, "single_host": self.world.single_host,
                "transports": {str(r): t for r, t in self.driver.transports().items()},
                "mcast_error": err}

    # -- descriptors ----------------------------------------------------------------------
    def handle(self, blob: bytes, payload: bytes) -> None:
        kind = D.kind_of(blob)
        if kind == D.POST:
            self._post(D.parse_post(blob))
        elif kind == D.SCHEDULE:
            self.schedules[D.parse_schedule(blob)] = pickle.loads(payload)
            if len(self.schedules) > SCHEDULES_KEPT:
                self.schedules.popitem(last=False)
        elif kind == D.ADD_COMM:
            call, comm, want = D.parse_add_comm(blob)
            self._answer(call, lambda: {"mcast_error": self._add_comm(
                comm, json.loads(payload), want)})
        elif kind == D.FREE_COMM:
            comm = D.parse_free_comm(blob)
            self.driver.free_comm(comm)
            if self.workers is not None:
                self.workers.leave(comm)
        elif kind == D.REFUSE:
            self.driver.refuse(D.parse_free_comm(blob), payload.decode("utf-8", "replace"))
        elif kind == D.OFFLOAD_STATS:
            call, _ = D.parse_stats(blob)
            self._answer(call, self.server.stats)
        elif kind == D.STATS:
            call, comm = D.parse_stats(blob)
            self._answer(call, lambda: _stats(self.driver.stats(comm)))
        elif kind == D.BYE:
            threading.Thread(target=self._bye, args=(int(payload or b"0"),),
                             daemon=True).start()

    def _add_comm(self, comm: int, members: list[int], want: bool) -> str | None:
        err = self.driver.add_comm(comm, members, want)
        if self.workers is not None and want and len(members) > 1 and err is None:
            self.workers.join(comm, len(members))
        return err

    def _post(self, d: dict) -> None:
        req = d["req"]
        sched = self.schedules.get(d["sched_id"])
        if sched is None:
            self.complete(req, PolycastError(f"rank {self.rank}: request {req} names "
                                             f"schedule {d['sched_id']}, which is unknown"))
            return
        self.schedules.move_to_end(d["sched_id"])
        try:
            dt = np.dtype(d["dtype"] or np.uint8)
            send = self.arena.view(*d["send"], dt) if d["send"] else None
            recv = self.arena.view(*d["recv"], dt) if d["recv"] else None
            self.driver.buffers.register(req, sched, d["comm_rank"], send, recv,
                                         d["op"] or None)
        except (PolycastError, TypeError, ValueError) as exc:
            self.complete(req, exc if isinstance(exc, PolycastError) else
                          PolycastError(f"rank {self.rank}: bad descriptor: {exc}"))
            return
        rank = d["comm_rank"]
        request = HostRequest(req, d["comm"], lambda: f"rank {rank}: {sched.describe()}",
                              self.job.timeout_seconds)
        request.host = self
        if self.workers is not None:
            offsets = {}
            if d["send"]:
                offsets["send"] = d["send"][0]
            if d["recv"]:
                offsets["recv"] = d["recv"][0]
            self.posted[req] = _Posted(sched, offsets)
        try:
            self.driver.post(d["comm"], request, sched, d["itemsize"], d["dtype"], d["op"])
        except PolycastError as exc:
            self.driver.buffers.unregister(req)
            self.complete(req, exc)
        except Exception as exc:            # noqa: BLE001 - a bug here: fail it, loudly
            traceback.print_exc()
            self.driver.buffers.unregister(req)
            self.complete(req, PolycastError(f"rank {self.rank}: the offload process "
                                             f"failed to post request {req}: {exc!r}"))

    def complete(self, req: int, error: BaseException | None) -> None:
        with self._lock:
            self.posted.pop(req, None)
            if error is not None and self._closing.get(req):
                # A failed request's streams may still be written by a worker until it
                # acknowledges their CloseStream: only then may the rank reuse the buffer.
                self._parked[req] = error
                return
        blob, payload = D.done(req, error)
        self.channel.send(blob, payload)

    def closing_stream(self, req: int) -> None:
        with self._lock:
            self._closing[req] = self._closing.get(req, 0) + 1

    def stream_closed(self, req: int) -> None:
        with self._lock:
            n = self._closing.get(req, 0) - 1
            if n > 0:
                self._closing[req] = n
                return
            self._closing.pop(req, None)
            err = self._parked.pop(req, None)
        if err is not None:
            blob, payload = D.done(req, err)
            self.channel.send(blob, payload)

    def _answer(self, call: int, fn) -> None:
        try:
            answer = fn()
        except Exception as exc:            # noqa: BLE001 - handed back to the rank
            self.channel.send(D.reply(call, False), str(exc).encode())
            return
        self.channel.send(D.reply(call, True), json.dumps(answer).encode())

    # -- detaching ------------------------------------------------------------------------
    def _bye(self, call: int) -> None:
        if self.driver is not None:
            self.driver.close(CLOSE_SECONDS)
        self.channel.send(D.reply(call, True), b"{}")
        self.gone = True
        self.server.wake()

    def abort(self) -> None:
        """The rank died: close its connections at once, with no goodbye, so its peers
        see it lost (as they would in-process)."""
        self.gone = True
        if self.driver is not None:
            self.driver.progress.stop(CLOSE_SECONDS)


def _stats(st) -> dict | None:
    return None if st is None else dataclasses.asdict(st)


@dataclasses.dataclass
class _Posted:
    sched: object
    offsets: dict                   # buffer name -> byte offset in the rank's arena


class Server:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.config = current()         # this process's settings, read once (its secret)
        self.workers: Workers | None = None
        self.name = bytes.fromhex(cfg["socket"])
        self.timeout = float(cfg["timeout"])
        self.sel = selectors.DefaultSelector()
        self.hosts: dict[int, RankHost] = {}             # fd -> host
        self._ready: collections.deque = collections.deque()
        self._attaching = 0
        self._attached = 0
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")

    def stats(self) -> dict:
        """CPU seconds of this process and its workers, and the workers' counters."""
        return {"pid": os.getpid(), "cpu_s": time.process_time(),
                "workers": self.workers.stats() if self.workers is not None else []}

    def wake(self) -> None:
        try:
            self._wake_w.send(b"w")
        except OSError:
            pass

    def listen(self) -> bool:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.listener.bind(self.name)
        except OSError:
            return False            # another offload process serves this job here
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, "listen")
        return True

    def serve(self) -> None:
        start = time.monotonic()
        busy = False
        while True:
            for key, _ in self._select(0.0 if busy else IDLE_SELECT_SECONDS):
                if key.data == "listen":
                    self._accept()
                elif key.data == "wake":
                    try:
                        self._wake_r.recv(4096)
                    except OSError:
                        pass
                else:
                    host = key.data
                    if not host.channel.drain_socket():
                        self._drop(host, died=not host.gone)
                    else:
                        host.channel.flush()
            while self._ready:
                host = self._ready.popleft()
                self.hosts[host.sock.fileno()] = host
                self.sel.register(host.sock, selectors.EVENT_READ, host)
            busy = False
            for host in list(self.hosts.values()):
                if host.gone:
                    continue
                for blob, payload in host.channel.poll():
                    busy = True
                    try:
                        host.handle(blob, payload)
                    except Exception:       # noqa: BLE001 - a bad descriptor, not a crash
                        traceback.print_exc()
            with self._lock:
                attaching = self._attaching
            if not self.hosts and not attaching and not self._ready:
                if self._attached or time.monotonic() - start > self.timeout:
                    return

    def _select(self, timeout: float) -> list:
        """Sleep in select, with every rank's submission ring saying so (a rank that posts
        then rings the doorbell)."""
        if timeout <= 0:
            return self.sel.select(0)
        rings = [h.channel.ring_in for h in self.hosts.values() if not h.gone]
        for ring in rings:
            ring.set_sleeping(True)
        try:
            if any(ring.pending_input() for ring in rings):
                timeout = 0.0
            return self.sel.select(timeout)
        finally:
            for ring in rings:
                ring.set_sleeping(False)

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        with self._lock:
            self._attaching += 1
        threading.Thread(target=self._attach, args=(sock,), daemon=True).start()

    def _attach(self, sock: socket.socket) -> None:
        host = None
        try:
            peer_pid(sock)
            hello = recv_line(sock, self.timeout)
            host = RankHost(self, sock, hello)
            try:
                world = host.connect()
            except Exception as exc:        # noqa: BLE001 - told to the rank
                sock.setblocking(True)
                send_line(sock, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
                raise
            sock.setblocking(True)
            send_line(sock, {"ok": True, "world": world})
            sock.setblocking(False)
            with self._lock:
                self._attached += 1
            self._ready.append(host)
        except Exception:                   # noqa: BLE001 - this rank only
            traceback.print_exc()
            if host is not None and host.driver is not None:
                host.driver.progress.stop(CLOSE_SECONDS)
            try:
                sock.close()
            except OSError:
                pass
        finally:
            with self._lock:
                self._attaching -= 1
            self.wake()

    def _drop(self, host: RankHost, died: bool) -> None:
        self.sel.unregister(host.sock)
        self.hosts.pop(host.sock.fileno(), None)
        if died:
            host.abort()
        host.channel.close()
        host.arena.close()

    def close(self) -> None:
        for host in list(self.hosts.values()):
            self._drop(host, died=not host.gone)
        if self.workers is not None:
            self.workers.stop()
        try:
            self.listener.close()
        except (OSError, AttributeError):
            pass


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # the ranks decide when we end
    cfg = json.loads(sys.stdin.read())
    server = Server(cfg)
    if not server.listen():
        return 0
    try:
        if int(cfg.get("workers", 0)) > 0:
            server.workers = Workers(int(cfg["workers"]), cfg.get("dgram", True))
        server.serve()
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)              # daemon threads of closed drivers must not hold us up
