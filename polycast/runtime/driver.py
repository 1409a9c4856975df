"""The progress thread: the runtime's driver of the sans-I/O engine.

One thread per process owns every engine (one per communicator), every socket, ring and
timer. User threads never touch them: they register their arrays, hand a command to the
thread through a queue (waking it with a socketpair) and wait on the request's event, with
a bound. The thread turns engine actions into I/O (Send -> TCP or shm frame, Multicast ->
UDP datagram, Deliver/Copy -> :class:`polycast.memory.Buffers`), and I/O back into engine
events. Many requests, on many communicators, progress at once.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import os
import selectors
import socket
import threading
import time
import warnings

from ..engine import wire
from ..engine.actions import (CancelTimer, Complete, Copy, Deliver, Fail, Multicast, Send,
                              SetTimer)
from ..engine.engine import Engine, EngineConfig
from ..errors import CollectiveTimeout, InvalidArgument, PeerLost, PolycastError
from ..memory import Buffers
from .frames import KIND_BYE, KIND_DOORBELL, control_frame, is_driver_kind
from .mcast import MulticastUnavailable, drop_own_datagrams, open_group
from .tcp import LinkClosed
from .world import World

IDLE_POLL_SECONDS = 0.05      # select bound while rings may need a look (lost doorbells)
# While requests are outstanding and input came recently, poll instead of sleeping in
# select (yielding the core between polls). Off by default: with more ranks than cores
# (4 ranks on 2 cores here) spinning steals the CPU the peers need, measured 2-3x slower.
# A user thread driving progress watches the rings (and sockets of peers without rings)
# for this much of its own time before it sleeps in select, yielding the core between
# looks; looks whose yield ran another process for a while do not count (4 ranks on 2
# cores: the peer we wait for often runs in our yield), but the wall bound caps it all.
# 8-byte allreduce, 4 ranks on 2 cores: 50, 200 and 500 us measured alike (300-380 us,
# the spread is other load), 20 us worse (426 us: more sleeps, so more doorbells).
DRIVE_SPIN_SECONDS = float(os.environ.get("POLYCAST_DRIVE_SPIN_US", "50")) * 1e-6
DRIVE_SPIN_WALL_SECONDS = float(os.environ.get("POLYCAST_DRIVE_SPIN_WALL_US", "1000")) * 1e-6
YIELD_RAN_OTHERS_SECONDS = 10e-6    # a yield longer than this ran someone else
FULL_ROUND_SECONDS = 0.0005  # a driving thread's bound between full rounds (sockets, timers)
PARK_SECONDS = 0.002          # the progress thread's nap while user threads drive progress
SPIN_SECONDS = float(os.environ.get("POLYCAST_SPIN_US", "0")) * 1e-6


class Request:
    """A posted collective. ``Wait`` / ``Test`` as mpi4py; see :mod:`polycast.comm`.

    ``desc`` may be given as a zero-argument callable: it is only needed for error
    messages, and formatting it on every small call measured ~2 us."""

    __slots__ = ("req", "comm", "_desc", "_done", "_ev", "error", "timeout_seconds",
                 "on_done", "result", "driver")

    def __init__(self, req: int, comm: int, desc, timeout_seconds: float) -> None:
        self.req, self.comm, self._desc = req, comm, desc
        # A flag, and an Event only for a thread that must block without a driver
        # (threading.Event() costs ~4 us; a driving waiter never needs one).
        self._done = False
        self._ev: threading.Event | None = None
        self.error: BaseException | None = None
        self.timeout_seconds = timeout_seconds
        self.on_done = None          # called with the request in the waiting thread
        self.result = None
        self.driver = None

    @property
    def desc(self) -> str:
        d = self._desc
        if not isinstance(d, str):
            d = self._desc = d()
        return d

    def _finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self._done = True
        ev = self._ev                # set after _done: a waiter that made ev sees one of them
        if ev is not None:
            ev.set()

    def Test(self) -> bool:
        """True once done (raises the request's error if it failed)."""
        if not self._done:
            return False
        self._finalize()
        return True

    def Wait(self, timeout: float | None = None):
        """Wait for completion, at most ``timeout`` seconds (default: the communicator's
        timeout plus a margin; the engine itself fails requests after that timeout)."""
        if not self._done:
            bound = timeout if timeout is not None else self.timeout_seconds + 5.0
            if self.driver is not None:
                self.driver.drive(self, time.monotonic() + bound)
            else:
                ev = self._ev
                if ev is None:
                    ev = self._ev = threading.Event()
                if not self._done:
                    ev.wait(bound)
            if not self._done:
                raise CollectiveTimeout(f"{self.desc}: not complete after {bound:g} s")
        self._finalize()
        return self.result

    def _finalize(self) -> None:
        if self.error is not None:
            raise self.error
        if self.on_done is not None:
            fn, self.on_done = self.on_done, None
            self.result = fn()

    @staticmethod
    def Waitall(requests, timeout: float | None = None) -> list:
        """Wait for every request (in order); the first error is raised after all ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        first = None
        results = []
        for r in requests:
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                results.append(r.Wait(left))
            except PolycastError as exc:
                results.append(None)
                first = first or exc
        if first is not None:
            raise first
        return results

    @staticmethod
    def Testall(requests) -> bool:
        return all(r.Test() for r in requests)


class _CommState:
    __slots__ = ("id", "engine", "members", "local_of", "mcast", "group", "mcast_error",
                 "dgram_out")

    def __init__(self, comm_id: int, engine: Engine, members: list[int]) -> None:
        self.id, self.engine, self.members = comm_id, engine, members
        self.local_of = {w: i for i, w in enumerate(members)}
        self.mcast = None
        self.group = None
        self.mcast_error: str | None = None
        self.dgram_out: collections.deque = collections.deque()


def _env_engine_config(config: EngineConfig) -> EngineConfig:
    """POLYCAST_MAX_EARLY_NBYTES / POLYCAST_EAGER_MAX_NBYTES override the engine's early
    buffer bound and rendezvous threshold (bytes; tests use them to force the late-rank
    path with small messages)."""
    import dataclasses
    changes = {}
    for var, name in (("POLYCAST_MAX_EARLY_NBYTES", "max_early_nbytes"),
                      ("POLYCAST_EAGER_MAX_NBYTES", "eager_max_nbytes")):
        text = os.environ.get(var)
        if text:
            try:
                changes[name] = int(text)
            except ValueError:
                raise InvalidArgument(f"{var}={text!r}: must be an integer number of "
                                      "bytes") from None
    if not changes:
        return config
    config = dataclasses.replace(config, **changes)
    config.validate()
    return config


class Driver:
    """Owns the engines and the I/O of one process; runs the progress thread."""

    def __init__(self, world: World, config: EngineConfig | None = None) -> None:
        self.world = world
        self.rank = world.rank
        self.config = _env_engine_config(config or EngineConfig(
            op_timeout_s=world.timeout_seconds))
        self.secret = self.config.secret
        self.buffers = Buffers()
        self._comms: dict[int, _CommState] = {}
        self._requests: dict[int, Request] = {}
        self._orphans: dict[int, list] = {}         # comm id -> held messages (comm not made yet)
        self._timers: dict[tuple[int, int], float] = {}
        self._timer_heap: list = []
        self._paced: list = []                       # (not_before, n, comm id, datagram)
        self._counter = itertools.count()
        self._req_ids = itertools.count(1)
        self._cmds: collections.deque = collections.deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._lost: dict[int, str] = {}
        self._gone: dict[int, str] = {}              # peers that closed in order (finalized)
        self._dirty: set[int] = set()                # peers with queued output
        self._want_bell: set[int] = set()
        self._rings_in = [(p.rank, p.ring_in) for p in world.peers.values() if p.ring_in]
        self._rings_out = [(p.rank, p.ring_out) for p in world.peers.values() if p.ring_out]
        self._last_full_round = 0.0                  # when a driving thread last ran _round
        self._write_armed: set[int] = set()         # peers whose socket waits for EVENT_WRITE
        self._tcp_only = any(p.ring_in is None for p in world.peers.values())
        for p in world.peers.values():
            self._sel.register(p.tcp.sock, selectors.EVENT_READ, ("peer", p.rank))
        self._stopping = False
        self._in_run = False
        self._queued_runs: collections.deque = collections.deque()
        self._plock = threading.Lock()               # engines, sockets, rings, timers
        self._driving = 0                            # user threads driving progress now
        self._drive_ended = 0.0
        self._drive_cv = threading.Condition()
        self._last_activity = 0.0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="polycast-progress",
                                        daemon=True)
        self._thread.start()

    # -- called from user threads -----------------------------------------------------------
    def call(self, fn, *args) -> None:
        """Run ``fn(*args)`` on the progress thread."""
        if self.error is not None:
            raise PolycastError(f"the progress thread died: {self.error!r}")
        self._cmds.append((fn, args))
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, InterruptedError):
            pass            # already plenty of wake-ups pending

    def call_sync(self, fn, *args, timeout: float = 30.0):
        box: list = []
        done = threading.Event()

        def run():
            try:
                box.append((True, fn(*args)))
            except BaseException as exc:          # handed back to the caller
                box.append((False, exc))
            done.set()
        self.call(run)
        if not done.wait(timeout):
            raise CollectiveTimeout(f"progress thread did not answer within {timeout:g} s")
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def new_request_id(self) -> int:
        return next(self._req_ids)

    def add_comm(self, comm_id: int, members: list[int], want_mcast: bool = True) -> str | None:
        """Create the engine of a communicator (and join its multicast group). Returns why
        multicast is unavailable, or None."""
        return self.call_sync(self._add_comm, comm_id, members, want_mcast)

    def free_comm(self, comm_id: int) -> None:
        self.call(self._free_comm, comm_id)

    def post(self, comm_id: int, request: Request, schedule, itemsize: int, dtype: str,
             op: str) -> None:
        if self.error is not None:
            raise PolycastError(f"the progress thread died: {self.error!r}")
        request.driver = self
        self._requests[request.req] = request
        # Straight into the engine from this thread: no hand-off, no wake-up.
        with self._plock:
            self._post(comm_id, request, schedule, itemsize, dtype, op)
            self._flush_all()

    def close(self, timeout: float = 5.0) -> None:
        if self._stopping or not self._thread.is_alive():
            return
        deadline = time.monotonic() + timeout
        try:
            self.call_sync(self._say_bye, timeout=timeout)
            # Queued bytes (a slow peer, a full ring) must leave before the sockets close.
            while self.call_sync(self._pending_output, timeout=timeout) and \
                    time.monotonic() < deadline:
                time.sleep(0.002)
        except PolycastError:
            pass
        self._stopping = True
        with self._drive_cv:
            self._drive_cv.notify_all()
        self.call(lambda: None)
        self._thread.join(timeout)

    # -- progress thread: commands ----------------------------------------------------------
    def _add_comm(self, comm_id: int, members: list[int], want_mcast: bool) -> str | None:
        if comm_id in self._comms:
            raise PolycastError(f"communicator id {comm_id} already exists")
        engine = Engine(members.index(self.rank), len(members), comm_id, self.config)
        cs = _CommState(comm_id, engine, members)
        self._comms[comm_id] = cs
        if want_mcast and len(members) > 1:
            try:
                cs.mcast, cs.group = open_group(self.world.job_id, comm_id,
                                                self.world.single_host)
                drop_own_datagrams(cs.mcast, engine.rank)
                self._sel.register(cs.mcast, selectors.EVENT_READ, ("mcast", comm_id))
            except MulticastUnavailable as exc:
                cs.mcast_error = str(exc)
        for w in members:
            if w in self._lost:
                self._run(cs, engine.on_peer_lost(cs.local_of[w], time.monotonic(),
                                                  self._lost[w]))
        for src, header, payload in self._orphans.pop(comm_id, []):
            self._run(cs, engine.on_message(cs.local_of[src], header, payload,
                                            time.monotonic()))
        return cs.mcast_error

    def _free_comm(self, comm_id: int) -> None:
        cs = self._comms.pop(comm_id, None)
        if cs is not None and cs.mcast is not None:
            self._sel.unregister(cs.mcast)
            cs.mcast.close()

    def _post(self, comm_id: int, request: Request, schedule, itemsize, dtype, op) -> None:
        cs = self._comms.get(comm_id)
        if cs is None:
            self._fail_request(request.req, PolycastError(
                f"{request.desc}: communicator {comm_id} was freed"))
            return
        try:
            actions = cs.engine.post(request.req, schedule, itemsize, time.monotonic(),
                                     dtype=dtype, op=op)
        except PolycastError as exc:
            self._fail_request(request.req, exc)
            return
        self._run(cs, actions)

    def _pending_output(self) -> bool:
        for r, p in self.world.peers.items():
            if r in self._lost or r in self._gone:
                continue
            if p.tcp.want_write or (p.ring_out is not None and p.ring_out.want_write):
                return True
        return any(cs.dgram_out for cs in self._comms.values()) or bool(self._paced)

    def _say_bye(self) -> None:
        for peer in self.world.peers.values():
            if peer.rank not in self._lost and peer.rank not in self._gone:
                peer.tcp.enqueue(KIND_BYE, b"", [], 0, None)
                self._dirty.add(peer.rank)
        self._flush_all()

    # -- progress thread: the loop ---------------------------------------------------------
    def _main(self) -> None:
        prof_path = os.environ.get("POLYCAST_PROFILE")      # debugging: cProfile the thread
        if prof_path:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        try:
            self._loop()
        except BaseException as exc:      # never die silently: fail everything outstanding
            self.error = exc
            for req in list(self._requests):
                self._fail_request(req, PolycastError(
                    f"the progress thread of rank {self.rank} died: {exc!r}"))
            raise
        finally:
            if prof_path:
                prof.disable()
                prof.dump_stats(f"{prof_path}.{self.rank}")
            self._shutdown()

    def _loop(self) -> None:
        while not self._stopping:
            if self._driving or time.monotonic() - self._drive_ended < PARK_SECONDS:
                # A user thread waiting on a request drives progress itself (no thread
                # hand-offs on the critical path); stay out of its way, and for a moment
                # after, since a blocking caller usually posts again at once. Parked, the
                # thread still looks every PARK_SECONDS for work nobody waits on.
                with self._drive_cv:
                    if not self._stopping:
                        self._drive_cv.wait(PARK_SECONDS)
                if not self._driving and self._plock.acquire(blocking=False):
                    try:
                        self._round()
                    finally:
                        self._plock.release()
                continue
            with self._plock:
                timeout = self._round()
            self._block(timeout)

    def _round(self) -> float:
        """One non-blocking pass over every source of work (call with ``_plock`` held).
        Returns how long the caller may block before the next pass."""
        self._drain_commands()
        busy = self._poll_rings()
        now = time.monotonic()
        self._fire_timers(now)
        self._send_paced(now)
        # A writer blocked on a full ring retries every round (its doorbell may have
        # been lost to a memory-ordering race; the select bound caps the delay).
        for r, ring in self._rings_out:
            if ring.want_write:
                self._dirty.add(r)
        self._flush_all()
        for key, mask in self._sel.select(0):
            kind, arg = key.data
            busy = True
            if kind == "peer":
                if mask & selectors.EVENT_READ:
                    self._read_peer(arg)
                if mask & selectors.EVENT_WRITE:
                    self._dirty.add(arg)
            elif kind == "mcast":
                if mask & selectors.EVENT_READ:
                    self._read_mcast(arg)
                if mask & selectors.EVENT_WRITE:
                    self._flush_dgrams(self._comms.get(arg))
            elif kind == "wake":
                try:
                    self._wake_r.recv(4096)
                except (BlockingIOError, InterruptedError):
                    pass
        if busy:
            self._flush_all()
        return self._select_timeout(busy)

    def _block(self, timeout: float) -> None:
        """Sleep until some input may be ready (without ``_plock``), at most ``timeout``."""
        if timeout <= 0:
            return
        rings = self._rings_in
        for _, ring in rings:
            ring.set_sleeping(True)
        try:
            if any(ring.pending_input() for _, ring in rings):
                return
            self._sel.select(timeout)
        finally:
            for _, ring in rings:
                ring.set_sleeping(False)

    def _spin(self, seconds: float) -> int:
        """Watch for input for up to ``seconds`` without sleeping, yielding the core
        between looks: 1 when a ring has input, 2 when a socket is readable (only watched
        for peers without rings: a select(0) per look), 0 when nothing came. Skips the
        doorbell a sleeping reader costs its writer."""
        if seconds <= 0:
            return 0
        rings = self._rings_in
        sel = self._sel if self._tcp_only else None
        if not rings and sel is None:
            return 0
        mono, yield_ = time.monotonic, os.sched_yield
        start = mono()
        end = start + max(seconds, DRIVE_SPIN_WALL_SECONDS)
        own = 0.0           # wall time of looks that came straight back from the yield
        last = start
        while True:
            for _, ring in rings:
                if ring.pending_input():
                    return 1
            if sel is not None and sel.select(0):
                return 2
            yield_()
            now = mono()
            # A yield that took long ran a peer meanwhile (4 ranks on 2 cores): that is
            # not our spinning, so only short looks count against the spin budget.
            step = now - last
            if step < YIELD_RAN_OTHERS_SECONDS:
                own += step
            last = now
            if own >= seconds or now >= end:
                return 0

    def _quick_round(self, now: float) -> bool:
        """The part of :meth:`_round` a driving thread needs when a ring has input: no
        select syscall (a full round runs at least every FULL_ROUND_SECONDS). Call with
        ``_plock`` held; returns whether there was work."""
        if self._cmds:
            self._drain_commands()
        busy = self._poll_rings()
        if self._timer_heap and self._timer_heap[0][0] <= now:
            self._fire_timers(now)
        if self._paced and self._paced[0][0] <= now:
            self._send_paced(now)
        for r, ring in self._rings_out:
            if ring.want_write:
                self._dirty.add(r)
        if self._dirty or self._want_bell:
            self._flush_all()
        return busy

    def drive(self, request: Request, deadline: float) -> None:
        """Progress from the calling (user) thread until ``request`` is done or the
        deadline passes.

        Small messages: the peers' answers usually come within microseconds, so the thread
        watches the rings (:meth:`_spin`, yielding the core) and handles what arrives with
        a quick round (rings and due timers only) instead of sleeping in select and
        being woken by a doorbell; a full round (sockets, multicast, commands) still runs
        at least every FULL_ROUND_SECONDS, and after DRIVE_SPIN_SECONDS without input the
        thread sleeps in select."""
        with self._drive_cv:
            self._driving += 1
        try:
            mono = time.monotonic
            lock = self._plock
            # Start with a quick round: right after a post the answer is rarely there yet,
            # and a full round (select syscall, every source) measured ~20 us. The bound
            # between full rounds holds across calls.
            full, spun = False, False
            while not request._done:
                now = mono()
                left = deadline - now
                if left <= 0 or not self._thread.is_alive():
                    return
                if not lock.acquire(timeout=min(left, IDLE_POLL_SECONDS)):
                    continue
                try:
                    if full or now - self._last_full_round >= FULL_ROUND_SECONDS:
                        did_full, self._last_full_round = True, now
                        timeout = self._round()
                    else:
                        did_full = False
                        timeout = 0.0 if self._quick_round(now) else 1.0
                finally:
                    lock.release()
                if request._done:
                    return
                full = False
                if timeout <= 0:
                    spun = False
                    continue
                if not spun:
                    got = self._spin(DRIVE_SPIN_SECONDS)
                    if got:
                        full = got == 2
                        continue
                    spun = True
                    if not did_full:
                        full = True         # the blocking timeout comes from a full round
                        continue
                self._block(min(timeout, left))
                full, spun = True, False
        finally:
            with self._drive_cv:
                self._driving -= 1
                self._drive_ended = time.monotonic()

    def _select_timeout(self, busy: bool) -> float:
        if busy or self._cmds:
            self._last_activity = time.monotonic()
            return 0.0
        if self._requests and SPIN_SECONDS > 0:
            if time.monotonic() - self._last_activity < SPIN_SECONDS:
                os.sched_yield()
                return 0.0
        t = IDLE_POLL_SECONDS if self._requests or self._rings_in else 1.0
        now = time.monotonic()
        if self._timer_heap:
            t = min(t, max(0.0, self._timer_heap[0][0] - now))
        if self._paced:
            t = min(t, max(0.0, self._paced[0][0] - now))
        return t

    def _drain_commands(self) -> None:
        while self._cmds:
            fn, args = self._cmds.popleft()
            fn(*args)

    # -- executing actions -----------------------------------------------------------------
    def _run(self, cs: _CommState, actions) -> None:
        """Carry out an engine call's actions in order. Actions of engine calls made while
        a list is being carried out wait behind the rest of it (the engine's contract)."""
        if self._in_run:
            self._queued_runs.append((cs, actions))
            return
        self._in_run = True
        try:
            self._run_list(cs, actions)
            while self._queued_runs:
                qcs, qactions = self._queued_runs.popleft()
                self._run_list(qcs, qactions)
        finally:
            self._in_run = False
            self._queued_runs.clear()

    def _run_list(self, cs: _CommState, actions) -> None:
        bufs = self.buffers
        for a in actions:        # engine calls made meanwhile queue in _queued_runs
            t = type(a)
            if t is Deliver:
                if a.region.req in bufs:
                    bufs.deliver(a.region, a.payload, a.reduce)
            elif t is Send:
                self._send(cs, a)
            elif t is Copy:
                if a.src.req in bufs:
                    bufs.copy(a.src, a.dst, a.reduce)
            elif t is Multicast:
                self._multicast(cs, a)
            elif t is SetTimer:
                self._timers[(cs.id, a.timer)] = a.deadline
                heap = self._timer_heap
                heapq.heappush(heap, (a.deadline, next(self._counter), cs.id, a.timer))
                if len(heap) > 1024 and len(heap) > 4 * len(self._timers):
                    # Every request sets a 60 s op timer and cancels it when done: drop the
                    # cancelled entries now rather than a minute later.
                    live = self._timers
                    heap[:] = [e for e in heap if live.get((e[2], e[3])) == e[0]]
                    heapq.heapify(heap)
            elif t is CancelTimer:
                self._timers.pop((cs.id, a.timer), None)
            elif t is Complete:
                bufs.finalize(a.req)
                bufs.unregister(a.req)
                req = self._requests.pop(a.req, None)
                if req is not None:
                    req._finish()
            elif t is Fail:
                self._fail_request(a.req, a.error)

    def _fail_request(self, req_id: int, error: BaseException) -> None:
        self.buffers.unregister(req_id)
        req = self._requests.pop(req_id, None)
        if req is not None:
            req._finish(error)

    def _send(self, cs: _CommState, a: Send) -> None:
        world_peer = cs.members[a.peer]
        peer = self.world.peers[world_peer]
        if a.payload is not None and a.payload.nbytes:
            views = [self.buffers.gather(a.payload)] if a.payload.req in self.buffers else []
            nbytes = a.payload.nbytes if views else 0
        elif a.data:
            views, nbytes = [a.data], len(a.data)
        else:
            views, nbytes = [], 0
        hdr = a.header.pack(self.secret, views) if self.secret else a.header.pack()
        token = (cs.id, a.token)
        if world_peer in self._lost or world_peer in self._gone:
            # The engine learns of the loss separately; the bytes have nowhere to go.
            self._run(cs, cs.engine.on_send_done(a.token, time.monotonic()))
            return
        link = peer.ring_out if peer.ring_out is not None else peer.tcp
        link.enqueue(len(hdr), hdr, views, nbytes, token)
        self._dirty.add(world_peer)

    def _flush_all(self) -> None:
        while self._dirty or self._want_bell:
            dirty, self._dirty = self._dirty, set()
            for r in dirty:
                self._flush_peer(r)
            bells, self._want_bell = self._want_bell, set()
            for r in bells:
                peer = self.world.peers[r]
                if r not in self._lost and r not in self._gone:
                    peer.tcp.enqueue(KIND_DOORBELL, b"", [], 0, None)
                    self._flush_peer(r)

    def _flush_peer(self, r: int) -> None:
        peer = self.world.peers[r]
        if r in self._lost or r in self._gone:
            return
        done = []
        if peer.ring_out is not None and peer.ring_out.want_write:
            toks, bell = peer.ring_out.flush()
            done.extend(toks)
            if bell:
                peer.tcp.enqueue(KIND_DOORBELL, b"", [], 0, None)
        if peer.tcp.want_write:
            try:
                done.extend(peer.tcp.flush())
            except LinkClosed as exc:
                self._peer_lost(r, str(exc))
                return
        want = peer.tcp.want_write
        if want != (r in self._write_armed):
            # Only touch the selector when write interest changes (get_key per flush
            # measured ~1 us on every small message).
            key = self._sel.get_key(peer.tcp.sock)
            self._sel.modify(peer.tcp.sock, selectors.EVENT_READ |
                             (selectors.EVENT_WRITE if want else 0), key.data)
            if want:
                self._write_armed.add(r)
            else:
                self._write_armed.discard(r)
        if not done:
            return
        now = time.monotonic()
        for comm_id, token in done:
            cs = self._comms.get(comm_id)
            if cs is not None:
                self._run(cs, cs.engine.on_send_done(token, now))

    # -- input -------------------------------------------------------------------------------
    def _poll_rings(self) -> bool:
        got = False
        for r, ring in self._rings_in:
            if not ring.pending_input():
                if ring.want_bell:
                    ring.want_bell = False
                    self._want_bell.add(r)
                continue
            frames: list = []
            if ring.poll(frames):
                self._want_bell.add(r)
            for hdr_len, header, payload, _key in frames:
                self._frame(r, hdr_len, header, payload)
            frames.clear()
            if ring.want_bell:
                ring.want_bell = False
                self._want_bell.add(r)
            got = got or bool(frames) or ring.pending_input()
            got = True
        return got

    def _read_peer(self, r: int) -> None:
        peer = self.world.peers[r]
        frames: list = []
        try:
            peer.tcp.read(frames)
        except LinkClosed as exc:
            for hdr_len, header, payload in frames:
                self._frame(r, hdr_len, header, payload)
            if peer.ring_in is not None:       # what the peer wrote before it left
                self._poll_rings()
            self._sel.unregister(peer.tcp.sock)
            if peer.tcp.bye:
                # An orderly close comes after the peer's last collective completed, so
                # everything it was going to send has arrived (perhaps ahead of our own
                # posts): tell the engine nothing. A call that still waits for it (ranks
                # calling different numbers of collectives) ends at the engine's timeout.
                self._gone[r] = "rank finalized"
                return
            self._peer_lost(r, f"connection lost: {exc}")
            return
        for hdr_len, header, payload in frames:
            self._frame(r, hdr_len, header, payload)

    def _frame(self, src: int, hdr_len: int, header_bytes: bytes, payload) -> None:
        if is_driver_kind(hdr_len):
            if hdr_len == KIND_DOORBELL:
                self._dirty.add(src)            # the peer freed ring space for us
            elif hdr_len == KIND_BYE:
                self.world.peers[src].tcp.bye = True
            return
        try:
            header = wire.parse_header(header_bytes, self.secret)
            if self.secret:
                wire.verify_mac(header, payload if payload is not None else b"", self.secret)
        except PolycastError:
            return          # counted by nobody: a corrupt frame on a reliable link is a bug
        cs = self._comms.get(header.comm)
        if cs is None:
            held = self._orphans.setdefault(header.comm, [])
            if len(held) < 100000:
                held.append((src, header, payload))
            return
        local = cs.local_of.get(src)
        if local is None:
            return
        self._run(cs, cs.engine.on_message(local, header, payload, time.monotonic()))

    def _read_mcast(self, comm_id: int) -> None:
        cs = self._comms.get(comm_id)
        if cs is None or cs.mcast is None:
            return
        eng = cs.engine
        for _ in range(256):
            try:
                data = cs.mcast.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            self._run(cs, eng.on_datagram(data, time.monotonic()))

    def _multicast(self, cs: _CommState, a: Multicast) -> None:
        if cs.mcast is None:
            return          # posting checked this; a datagram with no socket is just lost
        views = [self.buffers.gather(a.payload)] if (
            a.payload is not None and a.payload.req in self.buffers) else []
        hdr = a.header.pack(self.secret, views) if self.secret else a.header.pack()
        if a.not_before > time.monotonic() + 20e-6:
            # The engine counts a paced MCAST done at its last not_before, and the request may
            # complete (its buffer reused) before this datagram leaves: own the bytes.
            dgram = (hdr, [bytes(v) for v in views])
            heapq.heappush(self._paced, (a.not_before, next(self._counter), cs.id, dgram))
        else:
            cs.dgram_out.append((hdr, views))
            self._flush_dgrams(cs)

    def _flush_dgrams(self, cs: _CommState | None) -> None:
        if cs is None or cs.mcast is None:
            return
        q = cs.dgram_out
        while q:
            hdr, views = q[0]
            try:
                cs.mcast.sendmsg([hdr, *views], [], 0, cs.group)
            except (BlockingIOError, InterruptedError):
                _own_queued(q)
                break
            except OSError:
                pass        # e.g. ENOBUFS: a lost datagram, the protocol recovers it
            q.popleft()
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if q else 0)
        key = self._sel.get_key(cs.mcast)
        if key.events != events:
            self._sel.modify(cs.mcast, events, key.data)

    def _send_paced(self, now: float) -> None:
        touched = set()
        while self._paced and self._paced[0][0] <= now:
            _, _, comm_id, dgram = heapq.heappop(self._paced)
            cs = self._comms.get(comm_id)
            if cs is not None:
                cs.dgram_out.append(dgram)
                touched.add(comm_id)
        for comm_id in touched:
            self._flush_dgrams(self._comms.get(comm_id))

    def _fire_timers(self, now: float) -> None:
        heap = self._timer_heap
        while heap and heap[0][0] <= now:
            deadline, _, comm_id, timer = heapq.heappop(heap)
            if self._timers.get((comm_id, timer)) != deadline:
                continue            # moved or cancelled
            del self._timers[(comm_id, timer)]
            cs = self._comms.get(comm_id)
            if cs is not None:
                self._run(cs, cs.engine.on_timer(timer, now))

    def _peer_lost(self, r: int, reason: str) -> None:
        if r in self._lost:
            return
        self._lost[r] = reason
        now = time.monotonic()
        for cs in list(self._comms.values()):
            local = cs.local_of.get(r)
            if local is not None:
                self._run(cs, cs.engine.on_peer_lost(local, now, reason))

    def _shutdown(self) -> None:
        for cs in self._comms.values():
            if cs.mcast is not None:
                cs.mcast.close()
        for peer in self.world.peers.values():
            try:
                peer.tcp.sock.close()
            except OSError:
                pass
            for ring in (peer.ring_in, peer.ring_out):
                if ring is not None:
                    ring.close()
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- introspection ---------------------------------------------------------------------
    def transports(self) -> dict[int, str]:
        return {r: p.transport for r, p in self.world.peers.items()}

    def stats(self, comm_id: int = 0):
        cs = self._comms.get(comm_id)
        return None if cs is None else cs.engine.stats


def _warn(msg: str) -> None:
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


__all__ = ["Driver", "Request"]


def _own_queued(q) -> None:
    """Replace zero-copy views in datagrams still queued by copies: the engine considers an
    MCAST step done once it emitted its datagrams, so the request can complete and its
    buffer be reused while a blocked socket still holds them back."""
    for i, (hdr, views) in enumerate(q):
        if views and not isinstance(views[0], bytes):
            q[i] = (hdr, [bytes(v) for v in views])
