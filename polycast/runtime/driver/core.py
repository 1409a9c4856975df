"""The driver: engines of every communicator of the process, and their I/O.

The driver turns engine actions into I/O and I/O back into engine events. Its parts, each
readable alone: :mod:`.progress` (the progress thread and caller-driven progress),
:mod:`.execute` (carrying out actions), :mod:`.peers` (rings and TCP), :mod:`.datagrams`
(multicast), :mod:`.timers`, :mod:`.request` (what the user holds), :mod:`.replay` (small
calls replayed by the compiled helper) and :mod:`.direct` (repeated calls taken straight
from the comm layer into it). User threads never
touch engines or sockets outside the progress lock: they post under it, hand other
commands to the progress thread, and drive progress while they wait.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import numpy as np

from ... import debug
from ...config import Config
from ...engine import wire
from ...engine.actions import CloseStream, OpenStream, StreamData
from ...engine.engine import Engine, EngineConfig
from ...errors import PolycastError
from ...memory import Buffers
from ..bootstrap.report import process_state
from ..bootstrap.world import World
from ..transport import dgram
from .datagrams import MulticastIO
from .direct import DirectCall
from .execute import ActionRunner, CommState
from .peers import PeerIO
from .progress import Progress
from .replay import FRAME_OVERHEAD_NBYTES, Replayer, unavailable_reason as replay_unavailable
from .request import Request
from .timers import Timers

MAX_ORPHANS = 100000        # messages held per communicator not made yet
NOTES_SECONDS = 0.5         # how often timers may refresh the peers' process states
# A post moving more than this many bytes is handed to the progress thread instead of run
# on the caller's: its first actions copy the input (a 64 MiB ring allreduce's post copied
# 64 MiB and filled an 8 MiB ring: ~40 ms in a non-blocking call). Below it, no hand-off.
INLINE_POST_MAX_NBYTES = 256 << 10
# Messages between two ranks on shared-memory rings go eager up to this (other peers: the
# engine's eager_max_nbytes, 256 KiB): a RTS/CTS round trip in Python cost more than the
# second copy the ring makes, and an eager message fits one ring frame, so the compiled
# replay carries it (2 ranks, 1 MiB allgather, 512 KiB messages: 319 -> 122 us a call).
# Larger ones go by rendezvous, single-copy (runtime/transport/cma.py). Bounded so that one eager
# message from every peer fills at most a quarter of the early buffer, and raised only in
# calls of at most an eighth of it (Engine.eager_limits): a rank that posts late holds what
# its peers send it eager, so a large call's messages keep the rendezvous.
SHM_EAGER_MAX_NBYTES = 1 << 20


class Driver:
    """Owns the engines and the I/O of one process; runs the progress thread."""

    def __init__(self, world: World, engine_config: EngineConfig | None = None,
                 config: Config | None = None, *, mcast_io=MulticastIO,
                 on_action=None) -> None:
        """``engine_config``: the engines' (runtime/bootstrap/engine_config.py);
        ``config``: the job's settings (polycast.config: test hooks, multicast interface,
        faults...); ``mcast_io``: the multicast I/O class (the offload process sends on one
        group per root); ``on_action(comm_state, action)``: what to do with actions this
        driver does not carry out itself (the offload's OpenStream, StreamData,
        CloseStream). Received multicast chunks are placed by the compiled helper
        (runtime/transport/dgram.py) where it is built, unless the ``dgram=0`` test hook
        asks for the Python path."""
        self.world = world
        self.rank = world.rank
        self.config = config if config is not None else Config()
        self.engine_config = engine_config or EngineConfig(op_timeout_s=world.timeout_seconds)
        self.secret = self.engine_config.secret
        # The helper places what this driver's own sockets receive (not when someone else
        # places the streams: the offload's receive workers).
        placer = None
        if dgram.in_use(self.config.hooks) and on_action is None and \
                mcast_io is MulticastIO:
            placer = dgram.Placer(self.secret, landing=self.engine_config.mtu_nbytes
                                  >= dgram.LANDING_MIN_NBYTES)
            self.engine_config = dataclasses.replace(self.engine_config,
                                                     external_streams=True)
            on_action = self._stream_action
        if self.config.debug_level >= debug.INFO and mcast_io is MulticastIO:
            debug.info(self.rank, dgram.describe(placer is not None))
        self.buffers = Buffers()
        self.requests: dict[int, Request] = {}
        # Outstanding requests whose schedule multicasts: while there are any, sleepers
        # watch the multicast sockets (select), not only the rings' futex counters.
        self.mcast_requests: set[int] = set()
        self._mcast_of: dict[int, tuple] = {}
        self._comms: dict[int, CommState] = {}
        self._orphans: dict[int, list] = {}   # comm id -> held messages (comm not made yet)
        self._req_ids = itertools.count(1)
        self._notes_at = 0.0
        self.progress = Progress(self)
        self.timers = Timers()
        self.peers = PeerIO(world, self.progress.sel, self._on_frame, self._on_sent,
                            self._on_lost, self._on_gone, self.config)
        self.mcast = mcast_io(self.progress.sel, self._on_datagram, self.config, placer,
                              self._on_placed if placer is not None else None)
        self.runner = ActionRunner(self.buffers, self.requests, self.peers, self.mcast,
                                   self.timers, self.secret, self.mcast_requests, on_action)
        self._run = self.runner.run
        # Small calls replayed by the compiled helper (driver/replay.py), or why not.
        self.replay_off = replay_unavailable(self.config.hooks)
        self.progress.start()

    @property
    def error(self) -> BaseException | None:
        """Why the progress thread died, or None."""
        return self.progress.error

    def peer_down(self, world_rank: int) -> str | None:
        """Why a peer cannot be reached (connection lost, or finalized), or None."""
        return self.peers.down(world_rank)

    # -- called from user threads -----------------------------------------------------------
    def call(self, fn, *args) -> None:
        """Run ``fn(*args)`` on the progress thread."""
        self.progress.call(fn, *args)

    def call_sync(self, fn, *args, timeout: float = 30.0):
        """Run ``fn(*args)`` on the progress thread and return its result."""
        return self.progress.call_sync(fn, *args, timeout=timeout)

    def new_request_id(self) -> int:
        return next(self._req_ids)      # atomic under the GIL: any user thread may post

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
        self.requests[request.req] = request
        if self._multicasts(schedule):
            self.mcast_requests.add(request.req)
        if (schedule.count * itemsize > INLINE_POST_MAX_NBYTES
                or self.progress.has_commands()):
            # Large: the progress thread (or this thread, once it waits) runs it. Posts
            # keep their order: none runs inline while one is queued.
            self.progress.call(self._post_and_flush, comm_id, request, schedule, itemsize,
                               dtype, op)
            return
        # Straight into the engine from this thread: no hand-off, no wake-up.
        self.progress.user_active()
        with self.progress.lock:
            self._post_and_flush(comm_id, request, schedule, itemsize, dtype, op)

    def direct_call(self, comm_id: int, shape, send, recv,
                    timeout_seconds: float) -> DirectCall | None:
        """A repeated call of ``shape`` (``Request.replay`` of a call the replay ran whole:
        schedule, itemsize, dtype name, op name) with arrays like ``send`` and ``recv``, kept
        to go straight into the replay (direct.py), or None when it cannot: no replay for
        it here. Its I-variant runs there only up to INLINE_POST_MAX_NBYTES (larger posts are the
        progress thread's, as in :meth:`post`); the blocking form at any size the replay
        takes (its caller waits for the call anyway)."""
        cs = self._comms.get(comm_id)
        schedule, itemsize = shape[0], shape[1]
        if cs is None or cs.replay is None:
            return None
        with self.progress.lock:
            ent = cs.replay.entry(*shape)
        if ent is None:
            return None
        tmp = self.buffers.tmp_elements(schedule, cs.engine.rank)
        return DirectCall(self, cs, ent, shape, send, recv, timeout_seconds, tmp,
                          schedule.count * itemsize <= INLINE_POST_MAX_NBYTES)

    def refuse(self, comm_id: int, why: str) -> None:
        """This rank will not run its next call on ``comm_id`` (its arguments failed the
        checks here): the engine takes the call's turn and aborts the peers' call."""
        self._in_order(self._refuse, comm_id, why)

    def _refuse(self, comm_id: int, why: str) -> None:
        cs = self._comms.get(comm_id)
        if cs is not None:
            self._run(cs, cs.engine.refuse(why, time.monotonic()))
            self.peers.flush_all()

    def _in_order(self, fn, *args) -> None:
        """Run ``fn(*args)`` on the engine after every post queued before it (from this
        thread at once when nothing is queued, else on the progress thread): calls that
        take sequence numbers, and point-to-point messages, keep the caller's order."""
        if self.error is not None:
            raise PolycastError(f"the progress thread died: {self.error!r}")
        if self.progress.has_commands():
            self.progress.call(fn, *args)
            return
        self.progress.user_active()
        with self.progress.lock:
            fn(*args)

    # -- point to point (engine/p2p.py) ----------------------------------------------------
    def post_send(self, comm_id: int, request: Request, peer: int, tag: int,
                  send: np.ndarray, sync: bool = False) -> None:
        """Send the flat array ``send`` to local rank ``peer`` of ``comm_id`` (``sync``:
        complete only once a receive has matched it, MPI's Ssend)."""
        request.driver = self
        self.requests[request.req] = request
        self.buffers.register_arrays(request.req, send=send)
        self._in_order(self._p2p_post, comm_id, request, True, peer, tag, send.nbytes,
                       send.itemsize, sync)

    def post_recv(self, comm_id: int, request: Request, peer: int, tag: int,
                  recv: np.ndarray | None, message=None) -> None:
        """Receive into the flat array ``recv``, or (None) into a new byte array the size
        of the message, found in ``request.result`` once done. ``message``: a handle from
        ``iprobe(take=True)``, received instead of matching (MPI_Mrecv)."""
        request.driver = self
        self.requests[request.req] = request
        if recv is None:
            self.runner.allocate.add(request.req)
        else:
            self.buffers.register_arrays(request.req, recv=recv)
        self._in_order(self._p2p_post, comm_id, request, False, peer, tag,
                       None if recv is None else recv.nbytes,
                       1 if recv is None else recv.itemsize, False, message)

    def iprobe(self, comm_id: int, peer: int, tag: int, take: bool = False):
        """(source, tag, nbytes) of the first message a receive would take now, or None.
        ``take`` (a matched probe, MPI_Improbe): the message leaves matching, and a fourth
        item is its handle for :meth:`post_mrecv`."""
        if self.error is not None:
            raise PolycastError(f"the progress thread died: {self.error!r}")
        with self.progress.lock:
            cs = self._comms.get(comm_id)
            if cs is None:
                raise PolycastError(f"communicator {comm_id} was freed")
            self.progress.round()           # take in what has arrived
            return (cs.engine.improbe if take else cs.engine.iprobe)(peer, tag)

    def cancel_recv(self, comm_id: int, request: Request) -> bool:
        """MPI_Cancel of a receive no message has matched yet: it completes at once,
        cancelled (``request.cancelled``). False when it cannot be (matched, done, a
        send). Runs after this thread's queued posts, so a receive just posted is seen."""
        if self.progress.has_commands():
            return self.call_sync(self._cancel_recv, comm_id, request)
        with self.progress.lock:
            return self._cancel_recv(comm_id, request)

    def _cancel_recv(self, comm_id: int, request: Request) -> bool:
        cs = self._comms.get(comm_id)
        actions = None if cs is None or request._done else cs.engine.cancel_recv(request.req)
        if actions is None:
            return False
        request.cancelled = True
        self.runner.allocate.discard(request.req)
        self._run(cs, actions)
        return True

    def _p2p_post(self, comm_id: int, request: Request, is_send: bool, peer: int, tag: int,
                  nbytes, itemsize: int, sync: bool = False, message=None) -> None:
        cs = self._comms.get(comm_id)
        if cs is None:
            self.runner.fail_request(request.req, PolycastError(
                f"{request.desc}: communicator {comm_id} was freed"))
            return
        now = time.monotonic()
        try:
            if is_send:
                actions = cs.engine.post_send(request.req, peer, tag, nbytes, itemsize, now,
                                              sync)
            elif message is not None:
                actions = cs.engine.post_mrecv(request.req, message, nbytes, itemsize, now)
            else:
                actions = cs.engine.post_recv(request.req, peer, tag, nbytes, itemsize, now)
        except PolycastError as exc:
            self.runner.allocate.discard(request.req)
            self.runner.fail_request(request.req, exc)
            return
        self._run(cs, actions)
        self.peers.flush_all()

    def _multicasts(self, schedule) -> bool:
        """schedule.uses_multicast (a scan of every rank's program), remembered for the
        few schedules a process posts again and again."""
        hit = self._mcast_of.get(id(schedule))
        if hit is not None and hit[0] is schedule:
            return hit[1]
        if len(self._mcast_of) >= 64:
            self._mcast_of.pop(next(iter(self._mcast_of)))
        value = schedule.uses_multicast
        self._mcast_of[id(schedule)] = (schedule, value)
        return value

    def drive(self, request: Request, deadline: float) -> None:
        """Progress from the calling thread until ``request`` is done or the deadline."""
        self.progress.drive(request, deadline)

    def close(self, timeout: float = 5.0) -> None:
        if self.progress.stopping or not self.progress.alive:
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
        self.progress.stop(timeout)

    # -- progress thread: commands ----------------------------------------------------------
    def _add_comm(self, comm_id: int, members: list[int], want_mcast: bool) -> str | None:
        if comm_id in self._comms:
            raise PolycastError(f"communicator id {comm_id} already exists")
        engine = Engine(members.index(self.rank), len(members), comm_id, self.engine_config)
        engine.set_eager_limits(self._eager_limits(members))
        engine.set_pull_peers(self._pull_limits(members))
        cs = CommState(comm_id, engine, members)
        if self.replay_off is None and len(members) > 1:
            cs.replay = Replayer(self, cs)
        self._comms[comm_id] = cs
        if want_mcast and len(members) > 1:
            cs.mcast_error = self.mcast.open(comm_id, self.world.job_id,
                                             self.world.single_host, engine.rank)
        lost = self.peers.lost
        for w in members:
            if w in lost:
                self._run(cs, engine.on_peer_lost(cs.local_of[w], time.monotonic(), lost[w]))
        for src, header, payload in self._orphans.pop(comm_id, []):
            self._run(cs, engine.on_message(cs.local_of[src], header, payload,
                                            time.monotonic()))
        return cs.mcast_error

    def _eager_limits(self, members: list[int]) -> dict[int, int]:
        """Local rank -> eager limit for the members on shared-memory rings
        (SHM_EAGER_MAX_NBYTES, within one ring frame and a quarter of the early buffer over
        all peers). Both ends of a pair work out the same value: they share the ring size,
        the config and the member count. Empty when POLYCAST_EAGER_MAX_NBYTES is set: it
        is the limit for every peer."""
        cfg = self.engine_config
        if self.config.eager_max_nbytes is not None or len(members) < 2:
            return {}
        bound = min(SHM_EAGER_MAX_NBYTES, cfg.max_early_nbytes // (4 * (len(members) - 1)))
        out = {}
        for local, w in enumerate(members):
            peer = self.world.peers.get(w)
            if w == self.rank or peer is None or peer.ring_in is None or peer.ring_out is None:
                continue
            limit = min(bound, min(peer.ring_in.max_piece, peer.ring_out.max_piece)
                        - FRAME_OVERHEAD_NBYTES)
            if limit > cfg.eager_max_nbytes:
                out[local] = limit
        return out

    def _pull_limits(self, members: list[int]) -> dict[int, int]:
        """Local rank -> the smallest rendezvous message sent for it to pull (its DATA at
        once, held by the receiver until its RECV starts: Engine.set_pull_peers): members
        this process and they read single-copy both ways. Both ends work out the same value
        (each ring's verdict is in the ring). Empty under the cma_pull=0 test hook (RTS/CTS, for
        comparison)."""
        if not self.config.hooks.cma_pull:
            return {}
        peers = self.peers
        out = {}
        for local, w in enumerate(members):
            peer = self.world.peers.get(w)
            if w != self.rank and peer is not None and peers.pulls_to(w) \
                    and peer.ring_in is not None and peer.ring_in.cma_ok:
                out[local] = peers.cma_min_nbytes
        return out

    def _free_comm(self, comm_id: int) -> None:
        if self._comms.pop(comm_id, None) is not None:
            self.mcast.close(comm_id)

    def _post_and_flush(self, comm_id: int, request: Request, schedule, itemsize, dtype,
                        op) -> None:
        self._post(comm_id, request, schedule, itemsize, dtype, op)
        self.peers.flush_all()

    def _post(self, comm_id: int, request: Request, schedule, itemsize, dtype, op) -> None:
        cs = self._comms.get(comm_id)
        if cs is None:
            self.runner.fail_request(request.req, PolycastError(
                f"{request.desc}: communicator {comm_id} was freed"))
            return
        if cs.replay is not None and cs.replay.run(request, schedule, itemsize, dtype, op):
            return
        try:
            actions = cs.engine.post(request.req, schedule, itemsize, time.monotonic(),
                                     dtype=dtype, op=op)
        except PolycastError as exc:
            self.runner.fail_request(request.req, exc)
            return
        self._run(cs, actions)

    def _pending_output(self) -> bool:
        return self.peers.pending_output() or self.mcast.pending_output()

    def _say_bye(self) -> None:
        self.peers.say_bye()
        self.peers.flush_all()

    # -- events from the I/O into the engines ----------------------------------------------
    def _on_frame(self, src: int, header_bytes: bytes, payload) -> None:
        try:
            header = wire.parse_header(header_bytes, self.secret)
            if self.secret:
                wire.verify_mac(header, payload if payload is not None else b"", self.secret)
        except PolycastError as exc:
            # A forged or corrupt frame (wrong or missing MAC: runtime/bootstrap/auth.py): dropped and
            # counted with the world communicator's drops.
            cs = self._comms.get(0)
            if cs is not None:
                cs.engine.stats.drop(getattr(exc, "reason", "malformed"))
            return
        cs = self._comms.get(header.comm)
        if cs is None:
            held = self._orphans.setdefault(header.comm, [])
            if len(held) < MAX_ORPHANS:
                held.append((src, header, payload))
            return
        local = cs.local_of.get(src)
        if local is None:
            return
        self._run(cs, cs.engine.on_message(local, header, payload, time.monotonic()))

    def _on_sent(self, tokens: list) -> None:
        now = time.monotonic()
        for comm_id, token in tokens:
            cs = self._comms.get(comm_id)
            if cs is not None:
                self._run(cs, cs.engine.on_send_done(token, now))

    def _on_lost(self, r: int, reason: str) -> None:
        now = time.monotonic()
        for cs in list(self._comms.values()):
            local = cs.local_of.get(r)
            if local is not None:
                self._run(cs, cs.engine.on_peer_lost(local, now, reason))

    def _on_gone(self, r: int) -> None:
        now = time.monotonic()
        for cs in list(self._comms.values()):
            local = cs.local_of.get(r)
            if local is not None:
                self._run(cs, cs.engine.on_peer_gone(local, now))

    def _on_datagram(self, comm_id: int, data: bytes) -> None:
        cs = self._comms.get(comm_id)
        if cs is not None:
            self._run(cs, cs.engine.on_datagram(data, time.monotonic()))

    # -- the compiled datagram path (runtime/transport/dgram.py) ----------------------------
    def _on_placed(self, comm_id: int, progress, consumed: int, nbytes: int,
                   drops: dict) -> None:
        """What the helper placed of a communicator's streams, per stream."""
        cs = self._comms.get(comm_id)
        if cs is None:
            return
        eng = cs.engine
        st = eng.stats
        st.datagrams_in += consumed
        st.datagram_bytes_in += nbytes
        for why, n in drops.items():
            st.drops[why] = st.drops.get(why, 0) + n
        now = time.monotonic()
        for (_, seq, root, ordinal), ranges, eos in progress:
            self._run(cs, eng.on_stream_progress(seq, root, ordinal, ranges, now, eos=eos))

    def _stream_action(self, cs: CommState, a) -> None:
        """The engine's OpenStream / StreamData / CloseStream, for the helper's placer."""
        t = type(a)
        key = (cs.engine.comm, a.seq & 0xFFFFFFFF, a.root, a.ordinal)
        if t is OpenStream:
            reg = a.region
            if reg.req in self.buffers:
                self.mcast.open_stream(key, a.sig, self.buffers.array(reg.req, reg.buf),
                                       reg.runs, a.chunk_elems, a.nchunks)
        elif t is StreamData:
            rng = self.mcast.stream_data(key, a.offset, a.payload)
            if rng is not None:
                self._run(cs, cs.engine.on_stream_progress(a.seq, a.root, a.ordinal, [rng],
                                                           time.monotonic(),
                                                           recovered=a.recovered))
        elif t is CloseStream:
            self.mcast.close_stream(key)

    def engine_event(self, comm_id: int, fn) -> None:
        """Feed an engine an event that comes from outside this driver's own I/O (the
        offload's receive workers): ``fn(engine, now)`` returns its actions, carried out
        here under the progress lock, from any thread."""
        with self.progress.lock:
            cs = self._comms.get(comm_id)
            if cs is not None:
                self._run(cs, fn(cs.engine, time.monotonic()))
                self.peers.flush_all()

    def fire_timers(self, now: float) -> None:
        """Hand every timer due at ``now`` to its engine (progress lock held)."""
        timers = self.timers
        while True:
            due = timers.pop_due(now)
            if due is None:
                return
            cs = self._comms.get(due[0])
            if cs is not None:
                if now - self._notes_at > NOTES_SECONDS:
                    self._note_peers(now)
                self._run(cs, cs.engine.on_timer(due[1], now))

    def _note_peers(self, now: float) -> None:
        """Tell the engines which same-host peers are stopped or gone, so a timeout names
        the rank that holds everyone up (a SIGSTOPped rank keeps its connections open)."""
        self._notes_at = now
        notes = {}
        for r, peer in self.world.peers.items():
            if peer.same_host and peer.pid:
                note = process_state(peer.pid)
                if note:
                    notes[r] = note
        for cs in self._comms.values():
            cs.engine.peer_notes = {cs.local_of[r]: n for r, n in notes.items()
                                    if r in cs.local_of}

    def _shutdown(self) -> None:
        self.mcast.close_all()
        self.peers.close()

    # -- introspection ---------------------------------------------------------------------
    def transports(self) -> dict[int, str]:
        return {r: p.transport for r, p in self.world.peers.items()}

    def stats(self, comm_id: int = 0):
        cs = self._comms.get(comm_id)
        return None if cs is None else cs.engine.stats
