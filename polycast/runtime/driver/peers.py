"""Reliable I/O with every peer of the process: shared-memory rings and TCP links.

Knows frames, not engines: it queues frames to peers and flushes them (rings first, then
the TCP socket), reads frames from rings and sockets, rings doorbells, and tells its owner
through three callbacks what happened —

* ``on_frame(src, header_bytes, payload)``: an engine frame arrived from world rank src;
* ``on_sent(tokens)``: the frames queued with these tokens have all left;
* ``on_lost(rank, reason)``: a peer's connection broke (not an orderly close).

Driver-level frames (doorbells, the orderly ``bye``) are handled here and never passed on.
The runtime's driver uses it, and so can any other process that runs engines over the
same world (the offload process).
"""

from __future__ import annotations

import selectors

from .. import futex
from ..frames import KIND_BYE, KIND_DOORBELL, is_driver_kind
from ..shm import SLEEP_FUTEX
from ..tcp import LinkClosed
from ..world import World


class PeerIO:
    """The rings and TCP links of a :class:`World`; selector keys are ``("peer", rank)``."""

    def __init__(self, world: World, sel: selectors.BaseSelector, on_frame, on_sent,
                 on_lost) -> None:
        self.world = world
        self._sel = sel
        self._on_frame, self._on_sent, self._on_lost = on_frame, on_sent, on_lost
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
        self.futex = bool(self.rings_in) and futex.available()
        for p in peers:
            sel.register(p.tcp.sock, selectors.EVENT_READ, ("peer", p.rank))

    def down(self, r: int) -> str | None:
        """Why peer ``r`` cannot be reached (lost or finalized), or None."""
        return self.lost.get(r) or self.gone.get(r)

    # -- output ------------------------------------------------------------------------------
    def send(self, r: int, header: bytes, views: list, nbytes: int, token) -> bool:
        """Queue one engine frame to peer ``r`` (flushed by :meth:`flush_all`); False when
        the peer is down, so the bytes have nowhere to go."""
        if r in self.lost or r in self.gone:
            return False
        peer = self.world.peers[r]
        link = peer.ring_out if peer.ring_out is not None else peer.tcp
        link.enqueue(len(header), header, views, nbytes, token)
        self._dirty.add(r)
        return True

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
                        futex.wake(peer.ring_in.space_bell_addr)
                    peer.tcp.enqueue(KIND_DOORBELL, b"", [], 0, None)
                    self._flush_peer(r)

    def _flush_peer(self, r: int) -> None:
        peer = self.world.peers[r]
        if r in self.lost or r in self.gone:
            return
        done = []
        if peer.ring_out is not None and peer.ring_out.want_write:
            toks, bell = peer.ring_out.flush()
            done.extend(toks)
            if bell == SLEEP_FUTEX and self.futex:
                futex.wake(peer.ring_out.data_bell_addr)
            elif bell:
                # A doorbell also when the reader sleeps on its futex but this rank cannot
                # wake one (POLYCAST_FUTEX=0 here only): the reader's bounded wait ends it.
                peer.tcp.enqueue(KIND_DOORBELL, b"", [], 0, None)
        if peer.tcp.want_write:
            try:
                done.extend(peer.tcp.flush())
            except LinkClosed as exc:
                if done:                # written to the ring before the socket broke
                    self._on_sent(done)
                self.mark_lost(r, str(exc))
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
            self._on_sent(done)

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
                return
            self.mark_lost(r, f"connection lost: {exc}")
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
        self._on_frame(src, header_bytes, payload)

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
