"""The simulator's receivers behind a NIC of bounded chunk rate (``polycast sim --nic``).

A receiver's NIC (or host) processes the multicast receive path at ``rate`` bytes per
second — :meth:`polycast.models.nic.NicModel.bytes_per_s` at the model's chunk size — behind
a receive queue of ``queue_chunks`` chunks. The simulator's engines are unchanged: datagrams
the queue drops are simply not delivered, and the engines' real recovery protocol pulls
them from the ring successor.

What is modelled
----------------
* **A fluid queue per receiver.** Multicast flows arrive at a receiver at their flow rate
  (:mod:`polycast.sim.network`: a stream is one flow on its root's tree), every stream but
  its own. Between two event times every rate is constant, so the queue moves linearly:
  ``q' = arrivals - rate`` while 0 < q < capacity. While the queue is full the excess
  ``arrivals - rate`` is dropped, shared over the arriving streams in proportion to their
  rates, at the byte positions of those streams that arrived meanwhile.
* **Which datagrams are lost.** The simulator's datagrams are up to 65000 B (the engine's
  largest); the NIC's chunks are smaller. When a stream drains, each of its datagrams is
  given the dropped bytes that fell inside it, and datagrams are dropped per receiver by
  error diffusion (a running sum of dropped bytes; a datagram goes once the sum reaches
  half of it), so the bytes lost match the queue's drops to within one datagram, at the
  places they happened.
* **Datagrams without a flow** (end-of-stream markers) take one chunk's room each. A full
  queue still takes arrivals at ``rate``, shared by what arrives: a marker reaching a full
  queue gets in with probability ``rate / arrivals`` (seeded), always when nothing else
  arrives then — the same odds a data byte has. Markers arriving back to back get one such
  chance between them, not one each: a marker reaching a full queue less than one chunk's
  processing time (``chunk / rate``) after another marker had its chance there gets none
  (no room was freed meanwhile).
* **Queueing delay.** A stream's datagrams reach the engine when the NIC has worked through
  the queue in front of them: ``backlog / rate`` after they arrived.
* **Point-to-point data** (the reliable channel: recovery pulls, ring steps) is flow
  controlled, never dropped: each message to a receiver is capped at the NIC's rate.

Not modelled: the path latency between the flow's start and its arrival (the queue sees
arrivals at sending time; the delivery still adds the path latency), NIC time spent on
point-to-point data taken from the multicast path (each gets the full rate; concurrent
point-to-point messages to one receiver each get it too), bursts finer than one flow's
rate, and per-datagram costs on the sending side. Header bytes (framing.py) cost link
time but not NIC time: the queue counts payload.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False, slots=True)
class _Arrival:
    """A multicast flow arriving at every receiver but its root, and where it overflowed."""
    flow: object                  # polycast.sim.network.Flow
    root: int
    # (lo per receiver, hi, dropped share per receiver): flow bytes [lo, hi) arrived while
    # the receiver's queue was full, and that share of them was dropped
    segs: list = field(default_factory=list)


class ReceiveQueues:
    """One bounded receive queue per rank, drained at the NIC model's rate."""

    def __init__(self, model, nranks: int, seed: int = 0) -> None:
        self.model = model
        self.chunk_nbytes = model.chunk_nbytes
        self.rate = float(model.bytes_per_s(model.chunk_nbytes))       # bytes/s
        self.capacity = float(model.queue_chunks * model.chunk_nbytes)  # bytes
        self.P = nranks
        self.q = np.zeros(nranks)                # backlog per receiver, bytes
        self.t = 0.0
        self._arrivals: dict[int, _Arrival] = {}
        self._busy = False                       # some queue is non-empty
        self.dropped_nbytes = 0                  # payload bytes dropped, over receivers
        self.dropped_datagrams = 0               # datagram receptions dropped
        self.peak_nbytes = 0.0                   # largest backlog seen
        self._rng = np.random.default_rng([seed, 0x41C])
        self._chance_t = np.full(nranks, -np.inf)   # when a marker last had a full queue's chance

    # -- the driver's hooks ------------------------------------------------------------
    def add(self, flow, root: int) -> None:
        """A multicast flow from ``root`` started (its rate is set at the next settle)."""
        self._arrivals[flow.fid] = _Arrival(flow, root)

    def advance(self, t: float) -> None:
        """Bring every queue to time ``t`` with the flow rates of the interval before it."""
        dt = t - self.t
        if dt <= 0:
            return
        self.t = t
        arrivals = self._arrivals
        if not arrivals:
            if self._busy:
                q = self.q - self.rate * dt
                np.maximum(q, 0.0, out=q)
                self.q = q
                self._busy = bool(q.any())
            return
        lam = self._arrival_rates()
        net = lam - self.rate
        q = self.q + net * dt
        full = q > self.capacity
        if full.any():
            over = np.where(full, q - self.capacity, 0.0)        # bytes dropped
            q[full] = self.capacity
            over_t = np.zeros(self.P)                            # seconds spent full
            share = np.zeros(self.P)                             # of arrivals dropped
            over_t[full] = over[full] / net[full]
            share[full] = net[full] / lam[full]
            self._mark(t, over_t, share)
        np.maximum(q, 0.0, out=q)
        self.q = q
        self._busy = bool(q.any())
        peak = float(q.max())
        if peak > self.peak_nbytes:
            self.peak_nbytes = peak

    def _arrival_rates(self) -> np.ndarray:
        """Multicast bytes/s arriving at each receiver now."""
        lam = np.zeros(self.P)
        for a in self._arrivals.values():
            r = a.flow.rate * a.flow.goodput          # payload bytes/s (framing.py)
            if r > 0:
                lam += r
                lam[a.root] -= r
        return lam

    def _mark(self, t: float, over_t: np.ndarray, share: np.ndarray) -> None:
        for a in self._arrivals.values():
            f = a.flow
            g = f.goodput                   # positions in payload bytes (framing.py)
            r = f.rate * g
            if r <= 0:
                continue
            hi = (f.nbytes - (f.remaining - f.rate * (t - f.t_last))) * g   # sent by t
            lo = hi - r * over_t
            sh = share.copy()
            sh[a.root] = 0.0
            segs = a.segs
            if segs:
                plo, phi, psh = segs[-1]
                # steady overflow: one segment, not one per event
                if (np.array_equal(psh, sh)
                        and float(np.abs(lo - phi).max()) <= 1e-6 + 1e-12 * hi):
                    segs[-1] = (plo, hi, sh)
                    continue
            segs.append((lo, hi, sh))

    def take(self, fid: int | None, root: int, sizes: np.ndarray):
        """The datagrams of a drained flow ``fid`` (payload ``sizes``), or of no flow
        (``fid`` None: end-of-stream markers, one chunk of room each). Returns (keep, delay):
        ``keep`` a (datagram, rank) bool array or None when nothing was dropped, ``delay``
        per rank the seconds until the NIC has processed them."""
        n = len(sizes)
        if fid is None:
            keep = self._admit(root, n)
        else:
            keep = self._dropped(self._arrivals.pop(fid), sizes)
        if keep is not None:
            lost = ~keep
            lost[:, root] = False
            per_dgram = lost.sum(axis=1)
            if per_dgram.any():
                self.dropped_datagrams += int(per_dgram.sum())
                self.dropped_nbytes += int((per_dgram * sizes).sum())
            else:
                keep = None
        return keep, self.q / self.rate

    def _admit(self, root: int, n: int):
        """End-of-stream markers: each takes a chunk of room in the queue; a full queue
        takes one of markers arriving back to back with the odds of any arrival."""
        c = self.chunk_nbytes
        keep = np.ones((n, self.P), dtype=bool)
        q = self.q
        lam = self._arrival_rates()
        for j in range(n):
            ok = q + c <= self.capacity
            full = ~ok & (lam > self.rate)
            ok |= ~full
            # a full queue takes arrivals at `rate`, shared; one chance per freed chunk
            chance = full & (self.t - self._chance_t >= c / self.rate)
            if chance.any():
                ok[chance] = self._rng.random(int(chance.sum())) < self.rate / lam[chance]
                self._chance_t[chance] = self.t
            ok[root] = False                     # a root does not receive its own
            q[ok] += c
            np.minimum(q, self.capacity, out=q)
            ok[root] = True
            keep[j] = ok
        self._busy = bool(q.any())
        return keep if not keep.all() else None

    def _dropped(self, arrival: _Arrival, sizes: np.ndarray):
        if not arrival.segs:
            return None
        n = len(sizes)
        ends = np.cumsum(sizes, dtype=np.float64)
        starts = ends - sizes
        exp = np.zeros((n, self.P))                  # dropped bytes per datagram, receiver
        for lo, hi, sh in arrival.segs:
            ov = np.minimum(ends, hi)[:, None] - np.maximum(starts[:, None], lo[None, :])
            np.maximum(ov, 0.0, out=ov)
            exp += ov * sh[None, :]
        keep = np.ones((n, self.P), dtype=bool)
        acc = np.zeros(self.P)
        for j in range(n):
            acc += exp[j]
            s = sizes[j]
            if s <= 0:
                continue
            drop = acc >= s / 2
            if drop.any():
                keep[j, drop] = False
                acc[drop] -= s
        keep[:, arrival.root] = True
        return keep
