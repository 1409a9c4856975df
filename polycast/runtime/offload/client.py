"""A rank's side of offloaded progress: what its :class:`polycast.Comm` talks to instead of
an in-process :class:`~polycast.runtime.driver.Driver`.

:func:`attach` finds (local rank 0: starts) the host's offload process, makes the rank's
arena and rings, and waits until the offload process has connected the rank to the job.
:class:`OffloadClient` then posts descriptors and finishes requests from completions. A
small thread reads the completion ring (it sleeps in ``select`` on the doorbell socket, so
it costs nothing while nothing completes) and is the one that notices the offload process
dying: every outstanding request then fails with OffloadLost, as does every later call.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import os
import pickle
import socket
import subprocess
import sys
import threading
import time

import numpy as np

from ...config import Config, current
from ...errors import InvalidArgument, OffloadLost, PolycastError
from ...memory import Buffers, buffers_used
from ..driver.request import Request
from ..transport import faults as _faults
from ..bootstrap.env import JobEnv
from ..transport.shm import Ring, shm_unavailable_reason
from . import descriptors as D
from .arena import RankArena, shm_path
from .channel import (RING_NBYTES, Channel, check_platform, peer_pid, recv_line, send_line,
                      socket_name)

CONNECT_RETRY_SECONDS = 0.02
SCHEDULES_KEPT = 256            # the offload process keeps twice as many (same order)
WAIT_SLICE_SECONDS = 0.05       # a waiting thread re-checks liveness this often


@dataclasses.dataclass
class _Posted:
    request: Request
    blocks: list                    # arena offsets to free at completion
    copy_out: list                  # (user array, arena offset): staged outputs


class ClientBuffers:
    """``Comm._post``'s ``driver.buffers``: checks a call's arrays as in-process progress
    does (:class:`polycast.memory.Buffers`), then names each as an arena range, staging
    arrays that are not registered (or refusing them when staging is off)."""

    def __init__(self, arena: RankArena, staging: bool) -> None:
        self.arena = arena
        self.staging = staging
        self._check = Buffers()
        self._pending: dict[int, tuple] = {}   # req -> (rank, send, recv, blocks, copy_out)

    def register(self, req: int, schedule, rank: int, send, recv, op=None):
        dtype = self._check.register(req, schedule, rank, send, recv, op)
        self._check.unregister(req)
        used = buffers_used(schedule, rank)
        blocks: list[int] = []
        copy_out: list = []
        try:
            s = self._name(send, "send", blocks, copy_in=True) if send is not None else None
            if recv is not None and send is not None and _same_memory(send, recv):
                r = s
            else:
                r = self._name(recv, "recv", blocks, copy_in=False) \
                    if recv is not None else None
            if recv is not None and "recv" in used and self.arena.locate(recv) is None:
                copy_out.append((recv.reshape(-1), r[0]))
        except BaseException:
            for off in blocks:
                self.arena.free(off)
            raise
        self._pending[req] = (rank, s, r, blocks, copy_out)
        return dtype

    def _name(self, arr: np.ndarray, what: str, blocks: list, copy_in: bool):
        where = self.arena.locate(arr)
        if where is not None:
            return where
        if not self.staging:
            raise InvalidArgument(
                f"{what} buffer is not registered memory: with progress='offload' and "
                "POLYCAST_OFFLOAD_STAGING=0 every buffer must come from comm.empty() (or "
                "comm.symm_empty())")
        off = self.arena.alloc(arr.nbytes)
        if off is None:
            raise InvalidArgument(
                f"the offload arena has no room to stage a {arr.nbytes}-byte {what} buffer "
                f"({self.arena.used_nbytes} of {self.arena.nbytes} bytes in use): raise "
                "POLYCAST_OFFLOAD_ARENA or use comm.empty() buffers")
        blocks.append(off)
        if copy_in and arr.nbytes:
            np.copyto(self.arena.view(off, arr.nbytes, np.uint8),
                      arr.reshape(-1).view(np.uint8))
        return off, arr.nbytes

    def take(self, req: int):
        return self._pending.pop(req)

    def drop(self, req: int) -> None:
        ent = self._pending.pop(req, None)
        if ent is not None:
            for off in ent[3]:
                self.arena.free(off)

    def __contains__(self, req: int) -> bool:
        return req in self._pending


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.nbytes == b.nbytes)


class OffloadClient:
    """The driver interface a :class:`polycast.Comm` uses, over descriptor rings."""

    def __init__(self, job: JobEnv, sock: socket.socket, channel: Channel, arena: RankArena,
                 world: dict, server_pid: int, server: subprocess.Popen | None,
                 cfg: Config) -> None:
        self.rank = job.rank
        self.size = job.size
        self.job = job
        self.timeout_seconds = job.timeout_seconds
        self.channel = channel
        self.arena = arena
        self.config = cfg
        self.buffers = ClientBuffers(arena, cfg.offload_staging)
        self.server_pid = server_pid
        self._server = server
        self.job_id = world["job_id"]
        self.single_host = world["single_host"]
        self._transports = {int(k): v for k, v in world["transports"].items()}
        self.world_mcast_error = world.get("mcast_error")
        self.requests: dict[int, _Posted] = {}
        self._req_ids = itertools.count(1)
        self._calls = itertools.count(1)
        self._replies: dict[int, list] = {}
        self._reply_cv = threading.Condition()
        self._sched_ids = itertools.count(1)
        self._scheds: collections.OrderedDict = collections.OrderedDict()  # id(s) -> (s, sid)
        self._post_lock = threading.Lock()
        self.error: BaseException | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._completions, daemon=True,
                                        name="polycast-offload-completions")
        self._thread.start()

    # -- the interface Comm uses ----------------------------------------------------------
    def empty(self, shape, dtype) -> np.ndarray:
        """A new array in this rank's registered memory (``comm.empty``)."""
        return self.arena.array(shape, dtype)

    def new_request_id(self) -> int:
        return next(self._req_ids)

    def post(self, comm_id: int, request: Request, schedule, itemsize: int, dtype: str,
             op: str) -> None:
        comm_rank, send, recv, blocks, copy_out = self.buffers.take(request.req)
        if self.error is not None:
            for off in blocks:
                self.arena.free(off)
            raise self.error
        request.driver = self
        with self._post_lock:
            sid = self._schedule_id(schedule)
            self.requests[request.req] = _Posted(request, blocks, copy_out)
            self.channel.send(D.post(request.req, comm_id, sid, comm_rank, itemsize, dtype,
                                     op, send, recv))

    def _schedule_id(self, schedule) -> int:
        hit = self._scheds.get(id(schedule))
        if hit is not None and hit[0] is schedule:
            self._scheds.move_to_end(id(schedule))
            return hit[1]
        sid = next(self._sched_ids)
        self.channel.send(D.schedule(sid), pickle.dumps(schedule, pickle.HIGHEST_PROTOCOL))
        self._scheds[id(schedule)] = (schedule, sid)
        if len(self._scheds) > SCHEDULES_KEPT:
            self._scheds.popitem(last=False)
        return sid

    def drive(self, request: Request, deadline: float) -> None:
        """Wait (sleeping) until ``request`` is done or the deadline passes; the completion
        thread finishes it."""
        ev = request._ev
        if ev is None:
            ev = request._ev = threading.Event()
        while not request._done:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            ev.wait(min(left, WAIT_SLICE_SECONDS))

    def add_comm(self, comm_id: int, members: list[int], want_mcast: bool = True):
        answer = self._call(lambda call: (D.add_comm(call, comm_id, want_mcast),
                                          json.dumps(members).encode()))
        return answer.get("mcast_error")

    def refuse(self, comm_id: int, why: str) -> None:
        """This rank will not run its next call on ``comm_id``: the engine takes the call's
        turn and aborts the peers' (:meth:`polycast.runtime.driver.Driver.refuse`)."""
        if self.error is not None:
            raise self.error
        self.channel.send(D.refuse(comm_id), why.encode("utf-8", "replace"))

    def free_comm(self, comm_id: int) -> None:
        if self.error is None:
            self.channel.send(D.free_comm(comm_id))

    def stats(self, comm_id: int = 0):
        from ...engine.config import EngineStats
        answer = self._call(lambda call: (D.stats(call, comm_id), b""))
        return None if answer is None else EngineStats(**answer)

    def offload_stats(self) -> dict:
        """The offload process's CPU seconds and its receive workers' counters (pid,
        cpu_s, datagrams, placed chunks and bytes, drops)."""
        return self._call(lambda call: (D.offload_stats(call), b""))

    def transports(self) -> dict[int, str]:
        return dict(self._transports)

    def close(self, timeout: float = 5.0) -> None:
        """Say goodbye (the offload process closes this rank's connections in order),
        then let go of the rings and the arena."""
        if self._closing:
            return
        self._closing = True
        if self.error is None:
            try:
                self._call(lambda call: (D.bye(), str(call).encode()), timeout=timeout)
            except PolycastError:
                pass
        self.channel.close()
        self._thread.join(timeout)
        if self._server is not None:
            # The offload process leaves once every local rank has gone; usually this rank
            # was not the last, and it must not take the others' data path with it.
            try:
                self._server.wait(0.5)
            except subprocess.TimeoutExpired:
                pass

    # -- replies and completions ----------------------------------------------------------
    def _call(self, make, timeout: float | None = None):
        if self.error is not None:
            raise self.error
        call = next(self._calls)
        blob, payload = make(call)
        with self._reply_cv:
            self._replies[call] = []
        self.channel.send(blob, payload)
        bound = timeout if timeout is not None else self.timeout_seconds + 5.0
        deadline = time.monotonic() + bound
        with self._reply_cv:
            while not self._replies[call] and self.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    del self._replies[call]
                    raise OffloadLost(f"rank {self.rank}: the offload process (pid "
                                      f"{self.server_pid}) did not answer within {bound:g} s")
                self._reply_cv.wait(min(left, WAIT_SLICE_SECONDS))
            box = self._replies.pop(call)
        if not box:
            raise self.error
        ok, answer = box[0]
        if not ok:
            raise PolycastError(answer)
        return answer

    def _completions(self) -> None:
        ch = self.channel
        try:
            while True:
                frames = ch.poll()
                for blob, payload in frames:
                    self._completion(blob, payload)
                if frames:
                    continue
                if self._closing and ch.closed:
                    return
                if not ch.wait(WAIT_SLICE_SECONDS):
                    break
        except Exception as exc:            # noqa: BLE001 - reported to every waiter below
            why = f"reading its completions failed: {exc!r}"
        else:
            why = "it closed this rank's connection"
        if self._closing:
            why = "this rank is finalizing"
        self._lost(why)

    def _completion(self, blob: bytes, payload: bytes) -> None:
        kind = D.kind_of(blob)
        if kind == D.DONE:
            req, err = D.parse_done(blob, payload)
            posted = self.requests.pop(req, None)
            if posted is None:
                return
            if err is None:
                for arr, off in posted.copy_out:
                    if arr.nbytes:
                        np.copyto(arr.view(np.uint8), self.arena.view(off, arr.nbytes,
                                                                      np.uint8))
            for off in posted.blocks:
                self.arena.free(off)
            posted.request._finish(err)
        elif kind == D.REPLY:
            call, ok = D.parse_reply(blob)
            answer = json.loads(payload) if ok and payload else payload.decode()
            with self._reply_cv:
                box = self._replies.get(call)
                if box is not None:
                    box.append((ok, answer))
                    self._reply_cv.notify_all()

    def _lost(self, why: str) -> None:
        err = OffloadLost(f"rank {self.rank}: the offload process (pid {self.server_pid}) "
                          f"that carries this rank's communication is gone: {why}")
        self.error = err
        for req in list(self.requests):
            posted = self.requests.pop(req, None)
            if posted is not None:
                posted.request._finish(err)
        with self._reply_cv:
            self._reply_cv.notify_all()


# -- attaching ------------------------------------------------------------------------------
def _start_server(job: JobEnv, name: bytes, workers: int, hooks) -> subprocess.Popen:
    from ..transport import dgram
    cfg = {"socket": name.hex(), "local_size": job.local_size,
           "timeout": job.timeout_seconds, "workers": workers,
           "dgram": dgram.in_use(hooks)}     # the receive workers' datagram path (test hook)
    proc = subprocess.Popen([sys.executable, "-m", "polycast.runtime.offload.server"],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            start_new_session=True)
    proc.stdin.write(json.dumps(cfg).encode())
    proc.stdin.close()
    return proc


def attach(job: JobEnv, cfg: Config | None = None) -> OffloadClient:
    """Join the job through the host's offload process (started here by local rank 0),
    under the rank's settings ``cfg`` (default: read now; the offload process runs its
    engines with them)."""
    cfg = cfg if cfg is not None else current(rank=job.rank)
    check_platform()
    why = shm_unavailable_reason()
    if why:
        raise InvalidArgument(f"progress='offload' needs shared memory: {why}")
    workers = cfg.offload_workers
    nbytes = cfg.offload_arena_nbytes
    _faults.parse(cfg.faults)   # a bad POLYCAST_FAULTS here, not as a worker dying at start
    name = socket_name(job.master_addr, job.master_port)
    deadline = time.monotonic() + job.timeout_seconds
    server = _start_server(job, name, workers, cfg.hooks) if job.local_rank == 0 else None
    sock = None
    made: list = []
    try:
        sock = _connect(name, deadline, server, job)
        pid = peer_pid(sock)
        arena = RankArena(nbytes)
        made.append(arena)
        sq = Ring.create(shm_path("sq"), RING_NBYTES)
        made.append(sq)
        cq = Ring.create(shm_path("cq"), RING_NBYTES)
        made.append(cq)
        # The rank's settings, as variables (the job's secret is not among them: the
        # offload process has the one it was started with, as local rank 0)
        env = cfg.to_env()
        env.pop("POLYCAST_SECRET", None)
        send_line(sock, {"job": dataclasses.asdict(job), "env": env,
                         "pid": os.getpid(), "arena": [arena.path, arena.nbytes],
                         "sq": sq.path, "cq": cq.path, "ring_nbytes": RING_NBYTES})
        answer = recv_line(sock, max(0.1, deadline - time.monotonic()))
        for m in made:
            m.unlink()              # mapped by everyone who needs them now
        if not answer.get("ok"):
            raise PolycastError(f"rank {job.rank}: the offload process could not connect "
                                f"this rank: {answer.get('error')}")
        channel = Channel(sock, sq, cq)
        return OffloadClient(job, sock, channel, arena, answer["world"], pid, server, cfg)
    except (OSError, TimeoutError, ValueError) as exc:
        for m in made:
            m.unlink()
        if sock is not None:
            sock.close()
        if server is not None and server.poll() is None:
            server.kill()
        raise OffloadLost(f"rank {job.rank}: no offload process for this host: {exc}") \
            from None
    except BaseException:
        for m in made:
            m.unlink()
        if sock is not None:
            sock.close()
        raise


def _connect(name: bytes, deadline: float, server, job: JobEnv) -> socket.socket:
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(name)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
        if server is not None and server.poll() is not None:
            raise OSError(f"the offload process exited at start (status {server.returncode})")
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"none answered within {job.timeout_seconds:g} s (the host's local rank 0 "
                "starts it: is it running with progress='offload' too?)")
        time.sleep(CONNECT_RETRY_SECONDS)
