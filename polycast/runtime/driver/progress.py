"""Who runs the I/O and when: the progress thread, and user threads driving progress.

The progress thread loops over every source of work (commands from user threads, rings,
timers, paced datagrams, sockets) and sleeps in ``select`` when there is none. A user
thread waiting on a request (``Request.Wait``) drives progress itself, so no thread
hand-off sits on the critical path; the progress thread then parks. A driving thread waits
for input as the one wait policy says (runtime/transport/wait.py: spin, yield, then sleep
on the rings' futex counters or in select); the progress thread sleeps at once. Everything runs under
one lock (engines, sockets, rings, timers are not thread-safe).
"""

from __future__ import annotations

import collections
import ctypes
import selectors
import socket
import threading
import time

from ...errors import CollectiveTimeout, PolycastError
from ..transport import futex
from . import gil
from ..transport.shm import SLEEP_FUTEX, SLEEP_SELECT
from ..transport.wait import Waiter, policy as wait_policy

IDLE_POLL_SECONDS = 0.05      # select bound while rings may need a look (lost doorbells)
FULL_ROUND_SECONDS = 0.0005  # a driving thread's bound between full rounds (sockets, timers)
PARK_SECONDS = 0.002          # the progress thread's nap while user threads drive progress


class Progress:
    """The progress thread and caller-driven progress of one :class:`Driver`.

    Owns the selector every socket is registered with, the command queue and its wake-up
    socketpair, and the lock. A round asks the driver's parts for work: ``peers``
    (:class:`PeerIO`), ``mcast`` (:class:`MulticastIO`), ``timers`` and ``fire_timers``,
    ``requests``."""

    def __init__(self, driver) -> None:
        self.d = driver
        cfg = driver.config
        hooks = cfg.hooks
        self.wait = wait_policy(cfg)        # how a driving thread waits for input
        self.switch_seconds = cfg.gil_switch_us * 1e-6
        self.cprofile = hooks.cprofile       # cProfile the thread into <this>.<rank>
        self.sel = selectors.DefaultSelector()
        self._cmds: collections.deque = collections.deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._interrupts_at, self._interrupt_fds = -1, ()
        self.lock = threading.Lock()                 # engines, sockets, rings, timers
        self.stopping = False
        self._last_full_round = 0.0                  # when a driving thread last ran round
        self._driving = 0                            # user threads driving progress now
        self._drive_ended = 0.0
        self._drive_cv = threading.Condition()
        self.error: BaseException | None = None
        self._short = False          # holding gil.begin_short(): see _short_switch
        # Futex sleeps (see _block): a counter of this process bumped to hand a sleeper a
        # command, and the wait set, made once the peers are known (start()).
        self._cmd_word = ctypes.c_uint32(0)
        self._cmd_addr = ctypes.addressof(self._cmd_word)
        self._waitset: futex.WaitSet | None = None
        self._thread = threading.Thread(target=self._main, name="polycast-progress",
                                        daemon=True)

    def start(self) -> None:
        peers = self.d.peers
        if peers.futex and not peers.tcp_only:
            addrs = [(a, False) for a in peers.bell_addrs()] + [(self._cmd_addr, True)]
            if len(addrs) <= futex.MAX_WAITERS:
                self._waitset = futex.WaitSet(addrs)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- called from user threads -----------------------------------------------------------
    def call(self, fn, *args) -> None:
        """Run ``fn(*args)`` on the progress thread."""
        if self.error is not None:
            raise PolycastError(f"the progress thread died: {self.error!r}")
        self._cmds.append((fn, args))
        self._wake_futex_sleepers()
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, InterruptedError):
            pass            # already plenty of wake-ups pending

    def _wake_futex_sleepers(self) -> None:
        if self._waitset is not None:
            self._cmd_word.value = (self._cmd_word.value + 1) & 0xFFFFFFFF
            futex.wake_private(self._cmd_addr, 8)

    def user_active(self) -> None:
        """A user thread posted just now, on its own thread: the progress thread stays
        parked as it does after a drive. A blocking caller waits next (and drives), or
        finds its call already done and posts again; were the progress thread awake it
        would take the answers instead, every one a hand-off between the two threads
        (measured: 2 ranks, 8-byte allreduce, 40 % of messages taken by the progress thread,
        each a futex wake-up and a fight for the lock and the GIL). Parked, it still runs a
        round every PARK_SECONDS for requests nobody waits on."""
        self._drive_ended = time.monotonic()

    def has_commands(self) -> bool:
        return bool(self._cmds)

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

    def stop(self, timeout: float) -> None:
        self.stopping = True
        with self._drive_cv:
            self._drive_cv.notify_all()
        self._wake_futex_sleepers()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass            # full of wake-ups, or the thread has already closed it
        self._thread.join(timeout)

    # -- the progress thread -------------------------------------------------------------------
    def _main(self) -> None:
        d = self.d
        prof_path = self.cprofile
        if prof_path:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        try:
            self._loop()
        except BaseException as exc:      # never die silently: fail everything outstanding
            self.error = exc
            for req in list(d.requests):
                d.runner.fail_request(req, PolycastError(
                    f"the progress thread of rank {d.rank} died: {exc!r}"))
            raise
        finally:
            self._short_switch(False)
            if prof_path:
                prof.disable()
                prof.dump_stats(f"{prof_path}.{d.rank}")
            d._shutdown()
            self.sel.close()
            self._wake_r.close()
            self._wake_w.close()

    def _short_switch(self, want: bool) -> None:
        """Hold a short GIL switch interval (runtime/driver/gil.py) while this thread carries
        requests nobody drives (an overlapped Iallreduce while the user computes): each
        return from a sleep, a copy or a reduction takes the GIL back from the computing
        thread within POLYCAST_SWITCH_US instead of waiting out CPython's default interval
        beside pure-Python compute (bench/overlap.py shows the overlap it buys). Off while a
        user thread drives progress (blocking calls, Wait) or nothing is outstanding."""
        if want != self._short:
            if want:
                gil.begin_short(self.switch_seconds)
            else:
                gil.end_short()
            self._short = want

    def _loop(self) -> None:
        while not self.stopping:
            self._short_switch(bool(self.d.requests) and not self._driving)
            if self._driving or time.monotonic() - self._drive_ended < PARK_SECONDS:
                # A user thread waiting on a request drives progress itself (no thread
                # hand-offs on the critical path); stay out of its way, and for a moment
                # after, since a blocking caller usually posts again at once. Parked, the
                # thread still looks every PARK_SECONDS for work nobody waits on.
                with self._drive_cv:
                    if not self.stopping:
                        self._drive_cv.wait(PARK_SECONDS)
                if not self._driving and self.lock.acquire(blocking=False):
                    try:
                        self._round_waking_drivers()
                    finally:
                        self.lock.release()
                continue
            with self.lock:
                timeout = self._round_waking_drivers()
            self._block(timeout)

    def _round_waking_drivers(self) -> float:
        """:meth:`round` on the progress thread. A request it finished may be the one a
        user thread drives progress for: that thread may have looked at the request just
        before and be going to sleep on the rings (whose frame this round took), so it is
        woken (the command counter it sleeps on changes; a select sleeper gets a byte)."""
        runner = self.d.runner
        finished = runner.finished
        timeout = self.round()
        if runner.finished != finished and self._driving:
            self._wake_futex_sleepers()
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass            # full of wake-ups already
        return timeout

    def round(self) -> float:
        """One non-blocking pass over every source of work (call with ``lock`` held).
        Returns how long the caller may block before the next pass."""
        d = self.d
        peers = d.peers
        self._drain_commands()
        busy = peers.poll_rings()
        now = time.monotonic()
        d.mcast.send_paced(now)         # before timers: a paced MCAST ends at its last datagram
        d.fire_timers(now)
        peers.retry_blocked_writers()
        peers.flush_all()
        for key, mask in self.sel.select(0):
            kind, arg = key.data
            busy = True
            if kind == "peer":
                if mask & selectors.EVENT_READ:
                    peers.read_peer(arg)
                if mask & selectors.EVENT_WRITE:
                    peers.mark_writable(arg)
            elif kind == "mcast":
                if mask & selectors.EVENT_READ:
                    d.mcast.read(arg, self._interrupts(), self._idle_timeout(time.monotonic()))
                if mask & selectors.EVENT_WRITE:
                    d.mcast.flush(arg)
            elif kind == "wake":
                try:
                    self._wake_r.recv(4096)
                except (BlockingIOError, InterruptedError):
                    pass
        if busy:
            peers.flush_all()
        return self._select_timeout(busy)

    def _interrupts(self) -> tuple:
        """The descriptors of other input (peers' sockets, the command wake-up): a read
        that waits for more of a multicast stream stops when one is readable."""
        m = self.sel.get_map()
        if len(m) != self._interrupts_at:
            self._interrupts_at = len(m)
            self._interrupt_fds = tuple(k.fd for k in m.values()
                                        if k.data[0] in ("peer", "wake"))
        return self._interrupt_fds

    def _block(self, timeout: float, request=None) -> None:
        """Sleep until some input may be ready (without ``lock``), at most ``timeout``;
        not at all once ``request`` (the one a driving thread waits for) is done. It is
        looked at after the values the sleep compares are read: a request the progress
        thread finishes after that look changes one of them (:meth:`_round_waking_drivers`).

        When every peer has rings and no multicast call is outstanding, input can only
        come through the rings (the sockets carry doorbells and goodbyes, read at the next
        round): sleep on the rings' futex counters, woken by one FUTEX_WAKE from the writer
        instead of a doorbell frame. Otherwise sleep in select."""
        if timeout <= 0:
            return
        d = self.d
        peers = d.peers
        ws = self._waitset
        if ws is not None and not d.mcast_requests:
            values = peers.bell_values()
            values.append(self._cmd_word.value)
            peers.set_sleeping(SLEEP_FUTEX)
            try:
                if peers.rings_pending() or self._cmds or self.stopping or (
                        request is not None and request._done):
                    return
                ws.wait(values, timeout)
            finally:
                peers.set_sleeping(0)
            return
        peers.set_sleeping(SLEEP_SELECT)
        try:
            if peers.rings_pending() or (request is not None and request._done):
                return
            self.sel.select(timeout)
        finally:
            peers.set_sleeping(0)

    def _spin(self) -> int:
        """Watch for input as the wait policy says (spin, then yield the core between
        looks) until it says to sleep: 1 when a ring has input, 2 when a socket is readable
        (only watched for peers without rings: a select(0) per look), 0 when nothing came.
        Skips the doorbell a sleeping reader costs its writer."""
        peers = self.d.peers
        rings = peers.rings_in
        sel = self.sel if peers.tcp_only else None
        if not rings and sel is None:
            return 0
        w = Waiter(self.wait)
        idle = w.idle
        while True:
            for _, ring in rings:
                if ring.pending_input():
                    return 1
            if sel is not None and sel.select(0):
                return 2
            if idle():
                return 0

    def _quick_round(self, now: float) -> bool:
        """The part of :meth:`round` a driving thread needs when a ring has input: no
        select syscall (a full round runs at least every FULL_ROUND_SECONDS). Call with
        ``lock`` held; returns whether there was work."""
        d = self.d
        peers = d.peers
        if self._cmds:
            self._drain_commands()
        busy = peers.poll_rings()
        due = d.mcast.next_paced()
        if due is not None and due <= now:
            d.mcast.send_paced(now)     # before timers, as in round()
        due = d.timers.next_deadline()
        if due is not None and due <= now:
            d.fire_timers(now)
        peers.retry_blocked_writers()
        if peers.want_flush:
            peers.flush_all()
        return busy

    def drive(self, request, deadline: float) -> None:
        """Progress from the calling (user) thread until ``request`` is done or the
        deadline passes.

        Small messages: the peers' answers usually come within microseconds, so the thread
        watches the rings (:meth:`_spin`, yielding the core) and handles what arrives with
        a quick round (rings and due timers only) instead of sleeping in select and
        being woken by a doorbell; a full round (sockets, multicast, commands) still runs
        at least every FULL_ROUND_SECONDS, and when the wait policy says so the thread
        sleeps (on the rings' futex counters, or in select)."""
        with self._drive_cv:
            self._driving += 1
        try:
            mono = time.monotonic
            lock = self.lock
            # Start with a quick round: right after a post the answer is rarely there yet,
            # and a full round (select syscall, every source) measured ~20 us. The bound
            # between full rounds holds across calls.
            full, spun = False, False
            while not request._done:
                now = mono()
                left = deadline - now
                if left <= 0:
                    return
                if not lock.acquire(False) and \
                        not lock.acquire(timeout=min(left, IDLE_POLL_SECONDS)):
                    continue
                try:
                    if full or now - self._last_full_round >= FULL_ROUND_SECONDS:
                        did_full, self._last_full_round = True, now
                        timeout = self.round()
                    else:
                        did_full = False
                        timeout = 0.0 if self._quick_round(now) else 1.0
                finally:
                    lock.release()
                if request._done:
                    return
                if not self._thread.is_alive():
                    return
                full = False
                if timeout <= 0:
                    spun = False
                    continue
                if not spun:
                    got = self._spin()
                    if got:
                        full = got == 2
                        continue
                    spun = True
                futex_sleep = self._waitset is not None and not self.d.mcast_requests
                if not did_full:
                    if not futex_sleep:
                        full = True         # the blocking timeout comes from a full round
                        continue
                    # Only the rings (and commands) can wake a futex sleeper: what the
                    # sleep is bounded by needs no select, just the timers.
                    timeout = self._idle_timeout(mono())
                self._block(min(timeout, left), request)
                # Woken by a ring or a command: a quick round takes it (a full one still
                # runs every FULL_ROUND_SECONDS). From select, a socket may be ready.
                full, spun = not futex_sleep, False
        finally:
            with self._drive_cv:
                self._driving -= 1
                self._drive_ended = time.monotonic()

    def _idle_timeout(self, now: float) -> float:
        """How long a thread with nothing to do may sleep: until the next timer or paced
        datagram, at most IDLE_POLL_SECONDS (1 s without requests or rings)."""
        d = self.d
        t = IDLE_POLL_SECONDS if d.requests or d.peers.rings_in else 1.0
        due = d.timers.next_deadline()
        if due is not None:
            t = min(t, max(0.0, due - now))
        due = d.mcast.next_paced()
        if due is not None:
            t = min(t, max(0.0, due - now))
        return t

    def _select_timeout(self, busy: bool) -> float:
        if busy or self._cmds:
            return 0.0
        return self._idle_timeout(time.monotonic())

    def _drain_commands(self) -> None:
        while self._cmds:
            fn, args = self._cmds.popleft()
            fn(*args)
