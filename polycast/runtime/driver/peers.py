"""Reliable I/O with every peer of the process: shared-memory rings and TCP links.

Knows frames, not engines: it queues frames to peers and flushes them (rings first, then
the TCP socket), reads frames from rings and sockets, rings doorbells, and tells its owner
through three callbacks what happened —

* ``on_frame(src, header_bytes, payload)``: an engine frame arrived from world rank src;
* ``on_sent(tokens)``: the frames queued with these tokens have all left;
* ``on_lost(rank, reason)``: a peer's connection broke (not an orderly close).

Driver-level frames (doorbells, the orderly ``bye``, single-copy descriptors and their
acknowledgements) are handled here and never passed on. A large DATA to a peer on this host
whose ring said yes goes single-copy (:mod:`polycast.runtime.transport.cma`): a descriptor in the ring,
the payload read by the peer straight from our memory; its token is reported sent when the
peer acknowledges, and ``on_frame`` gets a :class:`~polycast.runtime.transport.cma.RemotePayload`.
The runtime's driver uses it, and so can any other process that runs engines over the
same world (the offload process).
"""

from __future__ import annotations

import selectors

from ...config import Config
from ...errors import PeerLost
from ..transport import cma, futex
from ..transport.frames import KIND_BYE, KIND_CMA, KIND_CMA_DONE, KIND_DOORBELL, is_driver_kind
from ..transport.shm import SLEEP_FUTEX
from ..transport import tcp
from ..transport.tcp import LinkClosed, SocketPayload
from ..bootstrap.world import World

# A ring's futex counter can have two sleepers in the process at once: the progress thread
# (carrying a request nobody waits on, e.g. an overlapped Iallreduce) and a user thread
# driving progress for the call it waits on (Barrier, Wait). Waking one lost the other's
# wake-up when the progress thread got it and finished the driver's request: the driver
# slept to its 50 ms bound (measured: every other Barrier after an overlapped 64 MiB
# Iallreduce took 50.5 ms on one of 2 ranks; 0.2-4 ms waking every sleeper).
WAKE_ALL = 1 << 30


class PeerIO:
    """The rings and TCP links of a :class:`World`; selector keys are ``("peer", rank)``."""

    def __init__(self, world: World, sel: selectors.BaseSelector, on_frame, on_sent,
                 on_lost, on_gone=None, cfg: Config | None = None) -> None:
        """``cfg``: the job's settings (single-copy threshold, futex and cma test hooks)."""
        cfg = cfg if cfg is not None else Config()
        self.world = world
        self._sel = sel
        self._on_frame, self._on_sent, self._on_lost = on_frame, on_sent, on_lost
        self._on_gone = on_gone
        self.lost: dict[int, str] = {}          # peers whose connection broke
        self.gone: dict[int, str] = {}          # peers that closed in order (finalized)
        self._dirty: set[int] = set()           # peers with queued output
        self._want_bell: set[int] = set()
        self._write_armed: set[int] = set()    # peers whose socket waits for EVENT_WRITE
        peers = world.peers.values()
        self.rings_in = [(p.rank, p.ring_in) for p in peers if p.ring_in]
        self.rings_out = [(p.rank, p.ring_out) for p in peers if p.ring_out]
        # Some peer has no ring: input can come on a socket only.
        self.tcp_only = any(p.ring_in is None for p in peers)
        # Futex wake-ups work here (a sleeper may wait on the rings' counters).
        self.futex = bool(self.rings_in) and cfg.hooks.futex and futex.available()
        # Single-copy: peers whose ring reader can read our memory; per peer the descriptors
        # sent and not yet acknowledged {seq: (token, view kept alive)}, and the seqs we
        # are done reading from each peer, not yet acknowledged (a held one is acknowledged
        # when read, so out of order).
        self.cma_min_nbytes = cfg.cma_min_nbytes
        self.cma_peers = {p.rank for p in peers if p.ring_out is not None and p.ring_out.cma_ok
                          and cma.disabled_reason(None, cfg.hooks.cma) is None}
        self._cma_seq = dict.fromkeys(self.cma_peers, 0)
        self._cma_wait: dict[int, dict] = {r: {} for r in self.cma_peers}
        self._cma_acks: dict[int, list] = {}
        self.cma_sent = self.cma_read = 0       # messages, for tests and benchmarks
        self.cma_held = 0                       # ... of them held unread past their frame
        # Sent tokens and losses seen while pumping (the engine is in the middle of handing
        # a frame a payload being read from its socket): reported once that frame is done.
        self._pumping = False
        self._held_sent: list = []
        self._held_lost: list = []
        stall_s = min(tcp.STALL_S, getattr(world, "timeout_seconds", None) or tcp.STALL_S)
        for p in peers:
            sel.register(p.tcp.sock, selectors.EVENT_READ, ("peer", p.rank))
            p.tcp.pump, p.tcp.stall_s = self._pump, stall_s

    def down(self, r: int) -> str | None:
        """Why peer ``r`` cannot be reached (lost or finalized), or None."""
        return self.lost.get(r) or self.gone.get(r)

    # -- output ------------------------------------------------------------------------------
    def send(self, r: int, header: bytes, views: list, nbytes: int, token,
             lazy_ok: bool = False) -> bool:
        """Send one engine frame to peer ``r``: written into its ring at once when it can be
        (its token reported sent right away), else queued for :meth:`flush_all`; False when
        the peer is down, so the bytes have nowhere to go. ``lazy_ok``: the receiving
        engine only delivers or keeps this payload (a DATA), so it may go single-copy;
        ``views`` must then stay untouched until the token is reported sent."""
        if r in self.lost or r in self.gone:
            return False
        if (lazy_ok and nbytes >= self.cma_min_nbytes and len(views) == 1
                and r in self.cma_peers):
            self._send_single_copy(r, header, views[0], nbytes, token)
            return True
        peer = self.world.peers[r]
        ring = peer.ring_out
        if ring is not None:
            # Straight into the ring when nothing waits before it: the frame is complete
            # now, so its send is reported done at once (the engine's next step need not
            # wait for a flush), and no queue, flush pass or token round trip is paid.
            bell = ring.write_now(len(header), header, views, nbytes)
            if bell is None:
                ring.enqueue(len(header), header, views, nbytes, token)
                self._dirty.add(r)
                return True
            if bell:
                self._wake_reader(r, peer, bell)
            if token is not None:
                self._sent([token])
            return True
        else:   # a DATA's payload may be received straight into its destination
            peer.tcp.enqueue(len(header), header, views, nbytes, token,
                             lazy_ok and self.world.key is None)
        self._dirty.add(r)
        return True

    def pulls_to(self, r: int) -> bool:
        """Whether a DATA to ``r`` of at least cma_min_nbytes in one view (the driver
        gathers every payload into one) goes single-copy, so ``r`` may hold it unread
        (Engine.set_pull_peers)."""
        return r in self.cma_peers

    def _send_single_copy(self, r: int, header: bytes, view, nbytes: int, token) -> None:
        seq = self._cma_seq[r] = self._cma_seq[r] + 1
        self._cma_wait[r][seq] = (token, view)
        desc = cma.DESC.pack(seq, cma.address_of(view), nbytes) + header
        self.cma_sent += 1
        peer = self.world.peers[r]
        ring = peer.ring_out
        # Into the ring at once, as any frame: the reader may start reading while we go on
        # (queued, it would leave only at the next flush, after the rest of the actions --
        # a collective's own 8 MiB copy, say).
        bell = ring.write_now(KIND_CMA, b"", [desc], len(desc))
        if bell is None:
            ring.enqueue(KIND_CMA, b"", [desc], len(desc), None)
            self._dirty.add(r)
        elif bell:
            self._wake_reader(r, peer, bell)

    def say_bye(self) -> None:
        """Queue the orderly-close frame to every peer still up."""
        for peer in self.world.peers.values():
            if peer.rank not in self.lost and peer.rank not in self.gone:
                peer.tcp.enqueue(KIND_BYE, b"", [], 0, None)
                self._dirty.add(peer.rank)

    def mark_writable(self, r: int) -> None:
        self._dirty.add(r)

    def retry_blocked_writers(self) -> None:
        """A writer blocked on a full ring retries every round (its doorbell may have been
        lost to a memory-ordering race; the select bound caps the delay)."""
        for r, ring in self.rings_out:
            if ring.want_write:
                self._dirty.add(r)

    @property
    def want_flush(self) -> bool:
        return bool(self._dirty or self._want_bell)

    def flush_all(self) -> None:
        while self._dirty or self._want_bell:
            dirty, self._dirty = self._dirty, set()
            for r in dirty:
                self._flush_peer(r)
            bells, self._want_bell = self._want_bell, set()
            for r in bells:
                peer = self.world.peers[r]
                if r not in self.lost and r not in self.gone:
                    # We freed space in the ring of a writer blocked on it: it sleeps in
                    # select (the doorbell frame) or on the ring's space counter.
                    if self.futex and peer.ring_in is not None:
                        futex.wake(peer.ring_in.space_bell_addr, WAKE_ALL)
                    peer.tcp.enqueue(KIND_DOORBELL, b"", [], 0, None)
                    self._flush_peer(r)

    def _flush_peer(self, r: int) -> None:
        peer = self.world.peers[r]
        if r in self.lost or r in self.gone:
            return
        done = []
        acks = self._cma_acks.pop(r, None)
        if acks:
            done_seqs = b"".join(cma.ACK.pack(seq) for seq in acks)
            peer.ring_out.enqueue(KIND_CMA_DONE, b"", [done_seqs], len(done_seqs), None)
        if peer.ring_out is not None and peer.ring_out.want_write:
            toks, bell = peer.ring_out.flush()
            done.extend(toks)
            if bell:
                self._wake_reader(r, peer, bell)
        if peer.tcp.want_write:
            try:
                done.extend(peer.tcp.flush())
            except LinkClosed as exc:
                if done:                # written to the ring before the socket broke
                    self._sent(done)
                self._lose(r, str(exc))
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
        if done:
            self._sent(done)

    def _wake_reader(self, r: int, peer, bell) -> None:
        """Frames were written to peer ``r``'s ring while its reader sleeps (``bell``:
        shm.SLEEP_FUTEX or SLEEP_SELECT): wake it."""
        if bell == SLEEP_FUTEX and self.futex:
            futex.wake(peer.ring_out.data_bell_addr, WAKE_ALL)
        else:
            # A doorbell also when the reader sleeps on its futex but this rank cannot
            # wake one (the futex=0 test hook here only): the reader's bounded wait ends it.
            peer.tcp.enqueue(KIND_DOORBELL, b"", [], 0, None)
            self._dirty.add(r)

    def _sent(self, tokens: list) -> None:
        if self._pumping:
            self._held_sent.extend(tokens)
        else:
            self._on_sent(tokens)

    def _lose(self, r: int, reason: str) -> None:
        if self._pumping:
            self._held_lost.append((r, reason))
        else:
            self.mark_lost(r, reason)

    def _pump(self) -> list:
        """Flush every queued output now: a payload is being read straight from its socket
        (tcp.SocketPayload) and the engine waits inside that read; a peer may be waiting
        for our bytes before it sends the rest. What completes is reported after the frame
        (:meth:`_report_held`), never into the engine in the middle of its work. Returns the
        sockets that still have output queued (the read's select waits on them too)."""
        if self._pumping:
            return []
        self._pumping = True
        try:
            writers = []
            for r, peer in self.world.peers.items():
                if r in self.lost or r in self.gone:
                    continue
                ring = peer.ring_out
                if peer.tcp.want_write or (ring is not None and ring.want_write) \
                        or r in self._cma_acks:
                    self._flush_peer(r)
                    if peer.tcp.want_write:
                        writers.append(peer.tcp.sock)
            return writers
        finally:
            self._pumping = False

    def _report_held(self) -> None:
        while self._held_sent or self._held_lost:
            if self._held_sent:
                tokens, self._held_sent = self._held_sent, []
                self._on_sent(tokens)
            if self._held_lost:
                lost, self._held_lost = self._held_lost, []
                for r, reason in lost:
                    self.mark_lost(r, reason)

    def pending_output(self) -> bool:
        for r, p in self.world.peers.items():
            if r in self.lost or r in self.gone:
                continue
            if p.tcp.want_write or (p.ring_out is not None and p.ring_out.want_write):
                return True
        return False

    # -- input -------------------------------------------------------------------------------
    def poll_rings(self) -> bool:
        """Hand every whole frame waiting in the rings to ``on_frame``; whether any ring
        had input."""
        got = False
        for r, ring in self.rings_in:
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
            got = True
        return got

    def rings_pending(self) -> bool:
        for _, ring in self.rings_in:
            if ring.pending_input():
                return True
        return False

    def set_sleeping(self, sleeping) -> None:
        """Tell the writers of our rings whether we sleep, and how (shm.SLEEP_SELECT: a
        doorbell frame wakes us; shm.SLEEP_FUTEX: a futex wake)."""
        for _, ring in self.rings_in:
            ring.set_sleeping(sleeping)

    def bell_addrs(self) -> list[int]:
        """The futex counters a sleeper waits on: every ring's data counter, then every
        outgoing ring's space counter (for a writer blocked on a full ring)."""
        return ([ring.data_bell_addr for _, ring in self.rings_in]
                + [ring.space_bell_addr for _, ring in self.rings_out])

    def bell_values(self) -> list[int]:
        return ([ring.data_bell() for _, ring in self.rings_in]
                + [ring.space_wait_value() for _, ring in self.rings_out])

    def read_peer(self, r: int) -> None:
        """Read what peer ``r``'s socket holds (its selector key was readable)."""
        peer = self.world.peers[r]
        frames: list = []
        try:
            peer.tcp.read(frames)
        except LinkClosed as exc:
            for hdr_len, header, payload in frames:
                self._frame(r, hdr_len, header, payload)
            if peer.ring_in is not None:       # what the peer wrote before it left
                self.poll_rings()
            self._sel.unregister(peer.tcp.sock)
            if peer.tcp.bye:
                # An orderly close comes after the peer's last collective completed, so
                # everything it was going to send has arrived (perhaps ahead of our own
                # posts): tell the engine nothing. A call that still waits for it (ranks
                # calling different numbers of collectives) ends at the engine's timeout.
                self.gone[r] = "rank finalized"
                self._discard_queued(r)
                if self._on_gone is not None:   # unless its last call had failed
                    self._on_gone(r)
                return
            self.mark_lost(r, f"connection lost: {exc}")
            return
        for hdr_len, header, payload in frames:
            self._frame(r, hdr_len, header, payload)

    def _frame(self, src: int, hdr_len: int, header_bytes: bytes, payload) -> None:
        if is_driver_kind(hdr_len):
            if hdr_len == KIND_CMA:
                self._single_copy_frame(src, payload)
            elif hdr_len == KIND_CMA_DONE:
                self._single_copy_done(src, payload)
            elif hdr_len == KIND_DOORBELL:
                self._dirty.add(src)            # the peer freed ring space for us
            elif hdr_len == KIND_BYE:
                self.world.peers[src].tcp.bye = True
            return
        if type(payload) is not SocketPayload:
            self._on_frame(src, header_bytes, payload)
            return
        try:
            self._on_frame(src, header_bytes, payload)
            # read now what the engine did not take, so the socket's next frame can be
            try:
                payload.finish()
            except PeerLost:
                self.mark_lost(src, payload.error)
        finally:
            self._report_held()

    def _single_copy_frame(self, src: int, frame) -> None:
        """A descriptor: the engine gets a RemotePayload; whatever it did not read while
        handling the frame is read now; then the writer may reuse its buffer."""
        seq, addr, nbytes = cma.DESC.unpack_from(frame)
        header = bytes(frame[cma.DESC.size:])
        rp = cma.RemotePayload(src, self.world.peers[src].pid, addr, nbytes, seq)
        self._on_frame(src, header, rp)
        if rp.holding:
            # The engine keeps it unread (a pulled DATA whose RECV has not started): the
            # writer hears when it is read, or let go.
            rp.on_done = lambda: self._single_copy_read(src, seq)
            self.cma_held += 1
            return
        try:
            rp.finish()
        except PeerLost:
            self.mark_lost(src, rp.error)
            return
        self._single_copy_read(src, seq)

    def _single_copy_read(self, src: int, seq: int) -> None:
        self.cma_read += 1
        self.acknowledge(src, seq)

    def acknowledge(self, src: int, seq: int) -> None:
        """Tell ``src`` at the next flush that its single-copy payload ``seq`` was read."""
        self._cma_acks.setdefault(src, []).append(seq)
        self._dirty.add(src)

    def await_ack(self, r: int, seq: int, token, keep) -> None:
        """A single-copy payload ``seq`` to ``r`` went out without us (the compiled replay,
        driver/replay.py): its ``token`` is reported sent on ``r``'s acknowledgement;
        ``keep`` (the array it lies in) is kept alive until then."""
        self._cma_wait[r][seq] = (token, keep)

    def _single_copy_done(self, src: int, frame) -> None:
        wait = self._cma_wait.get(src)
        if not wait:
            return
        tokens = []
        for (seq,) in cma.ACK.iter_unpack(frame):
            sent = wait.pop(seq, None)
            if sent is not None:
                tokens.append(sent[0])
        if tokens:
            self._on_sent(tokens)

    def mark_lost(self, r: int, reason: str) -> None:
        if r in self.lost:
            return
        self.lost[r] = reason
        self._on_lost(r, reason)
        self._discard_queued(r)

    def _discard_queued(self, r: int) -> None:
        """Frames still queued to a peer that is gone will never leave: report them sent
        (their memory may be reused), or a request waiting on their completion would wait
        forever. Nothing is lost: a finalized peer needed none of them (an unneeded
        recovery answer, say), and a lost one fails the requests that need it."""
        peer = self.world.peers[r]
        tokens = peer.tcp.discard_queued()
        wait = self._cma_wait.get(r)
        if wait:
            tokens = [t for t, _ in wait.values()] + tokens
            wait.clear()
        if peer.ring_out is not None:
            tokens = peer.ring_out.discard_queued() + tokens
        if tokens:
            self._on_sent(tokens)

    def close(self) -> None:
        for peer in self.world.peers.values():
            try:
                peer.tcp.sock.close()
            except OSError:
                pass
            for ring in (peer.ring_in, peer.ring_out):
                if ring is not None:
                    ring.close()
