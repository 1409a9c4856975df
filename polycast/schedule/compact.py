"""Schedules as columns: the same steps as a :class:`~polycast.schedule.ir.Schedule`, held
as numpy arrays instead of millions of :class:`~polycast.schedule.ir.Step` objects.

A 1024-rank ring allgather is two million steps; as objects they take seconds to build and
about 300 bytes each, as columns a few tens of milliseconds and about 30 bytes. What times
a schedule (the simulator's fast path, :mod:`polycast.sim.fast`) needs only the columns:
per step its kind, rank, peer, tag (the message ordinal), element count and dependencies.

* :class:`Columns` -- the arrays, steps of rank 0 first, each rank's in program order.
* :func:`columns_of` -- the columns of any schedule (one pass over its steps).
* :class:`Template` -- a schedule every rank of which runs one program up to a shift (a
  ring): one row per program position, O(P + L) memory for P^2 steps; its columns on demand.
  The simulator's fast path times it position by position without the columns
  (:mod:`polycast.sim.fast_stream`).
* :class:`TokenMulticast`, :class:`HostRing` -- the multicast allgathers (over ranks or
  hosts' leaders) and the hierarchical ring allgather, each held as a few numbers.
* :class:`CompactSchedule` -- a schedule whose columns come from a vectorised generator
  (registered beside the algorithm's own, :func:`polycast.algorithms.registry.register_compact`)
  and whose ``programs`` are built by the algorithm's own generator only when something
  asks for them (the engines, the verifier). Tests hold every vectorised generator to
  ``columns_of`` of the algorithm's own schedule, so a compact schedule is that schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from .ir import Kind, PerRank, Schedule


@dataclass(eq=False)
class Columns:
    nranks: int
    kind: np.ndarray          # int8 Kind per step
    local: np.ndarray         # int32 rank of the step (non-decreasing)
    peer: np.ndarray          # int32 (-1: none)
    tag: np.ndarray           # int32 message ordinal (-1: COPY)
    nelems: np.ndarray        # int64 elements the step moves (0: control)
    dep_counts: np.ndarray    # int32 dependencies per step
    dep_flat: np.ndarray      # int64 step numbers (in these columns) of the dependencies
    options: dict = field(default_factory=dict)   # generator options the schedule records

    @property
    def nsteps(self) -> int:
        return len(self.kind)

    @property
    def starts(self) -> np.ndarray:
        """First step of each rank (and the total at the end)."""
        return np.searchsorted(self.local, np.arange(self.nranks + 1)).astype(np.int64)

    @property
    def idx(self) -> np.ndarray:
        """Position of every step in its rank's program."""
        return np.arange(self.nsteps, dtype=np.int64) - self.starts[self.local]

    @property
    def uses_multicast(self) -> bool:
        return bool(((self.kind == Kind.MCAST) | (self.kind == Kind.MRECV)).any())

    def same_as(self, other: "Columns") -> bool:
        return self.nranks == other.nranks and all(
            np.array_equal(getattr(self, f), getattr(other, f))
            for f in ("kind", "local", "peer", "tag", "nelems", "dep_counts", "dep_flat"))

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, f).nbytes for f in ("kind", "local", "peer", "tag", "nelems",
                                                      "dep_counts", "dep_flat"))


def columns_of(schedule: Schedule) -> Columns:
    """The columns of any schedule (of a compact one: its own)."""
    cols = getattr(schedule, "columns", None)
    if cols is not None:
        return cols
    progs = schedule.programs
    n = schedule.nranks
    lens = [len(p) for p in progs]
    steps = [st for p in progs for st in p]
    ns = len(steps)
    local = np.repeat(np.arange(n, dtype=np.int32), lens)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    kind = np.fromiter((s.kind for s in steps), np.int8, ns)
    peer = np.fromiter((s.peer for s in steps), np.int32, ns)
    tag = np.fromiter((s.tag for s in steps), np.int32, ns)
    nd = np.fromiter((len(s.deps) for s in steps), np.int32, ns)
    flat = np.fromiter(chain.from_iterable(s.deps for s in steps), np.int64, int(nd.sum()))
    flat += np.repeat(np.repeat(starts, lens), nd)
    lays = schedule.layouts
    uniform = {b for b, l in lays.items() if not isinstance(l, PerRank)}
    memo: dict = {}
    nelems = np.zeros(ns, dtype=np.int64)
    loc = local.tolist()
    for i, s in enumerate(steps):
        blocks = s.blocks
        if not blocks:
            continue
        buf = s.buf
        key = (buf, blocks) if buf in uniform else (buf, loc[i], blocks)
        v = memo.get(key)
        if v is None:
            v = memo[key] = lays[buf].on(loc[i]).nelems_of(blocks)
        nelems[i] = v
    return Columns(n, kind, local, peer, tag, nelems, nd, flat)


@dataclass(eq=False)
class Template:
    """Every rank r runs one program of L positions, shifted: position j is a step of kind
    ``kind[j]`` with peer ``(r + delta[j]) % nranks`` (COPY: none), message ordinal
    ``tag[j]``, ``tables[table_of[j], (r - shift[j]) % nranks]`` elements and dependencies
    ``dep_flat[dep_ptr[j]:dep_ptr[j + 1]]`` (earlier positions of the same rank)."""
    nranks: int
    kind: np.ndarray          # (L,) int8 Kind: SEND, RECV or COPY
    delta: np.ndarray         # (L,) int64 peer offset, 0 <= delta < nranks (COPY: 0)
    tag: np.ndarray           # (L,) int64 message ordinal (-1: COPY)
    tables: np.ndarray        # (T, nranks) int64 element counts
    table_of: np.ndarray      # (L,) int64 row of ``tables``
    shift: np.ndarray         # (L,) int64 rank shift of the row's index
    dep_counts: np.ndarray    # (L,) int32
    dep_flat: np.ndarray      # int64 positions
    options: dict = field(default_factory=dict)

    @property
    def length(self) -> int:
        return len(self.kind)

    @property
    def nsteps(self) -> int:
        return self.nranks * self.length

    @property
    def dep_ptr(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.dep_counts)]).astype(np.int64)

    def last_read(self) -> np.ndarray:
        """Per position, the last position depending on it (-1: none)."""
        last = np.full(self.length, -1, np.int64)
        owner = np.repeat(np.arange(self.length, dtype=np.int64), self.dep_counts)
        np.maximum.at(last, self.dep_flat, owner)
        return last

    def live_positions(self) -> int:
        """The most positions whose times a pass in program order holds at once (a
        position is held from itself until its last dependant)."""
        last = self.last_read()
        j = np.flatnonzero(last >= 0)
        if not len(j):
            return 0
        d = np.zeros(self.length + 1, np.int64)
        np.add.at(d, j, 1)
        np.add.at(d, last[j] + 1, -1)
        return int(np.cumsum(d).max())

    @property
    def uses_multicast(self) -> bool:
        return bool(np.isin(self.kind, (Kind.MCAST, Kind.MRECV)).any())

    def held_per_rank(self) -> int:
        """8-byte values per rank the fast path's stream mode holds at once, beyond its
        fixed state: the times of the live positions."""
        return self.live_positions()

    def nelems_at(self, j: int) -> np.ndarray:
        """Elements of position ``j`` on every rank."""
        P = self.nranks
        return np.roll(self.tables[self.table_of[j]], int(self.shift[j]) % P)

    def columns(self) -> Columns:
        """The same steps as :class:`Columns` (P x L of them)."""
        P, L = self.nranks, self.length
        r = np.arange(P, dtype=np.int64)[:, None]
        copy = self.kind == Kind.COPY
        peer = np.where(copy[None, :], -1, (r + self.delta[None, :]) % P)
        nel = self.tables[self.table_of[None, :], (r - self.shift[None, :]) % P]
        base = (np.arange(P, dtype=np.int64) * L)[:, None]
        return Columns(P, np.tile(self.kind.astype(np.int8), P),
                       np.repeat(np.arange(P, dtype=np.int32), L),
                       peer.astype(np.int32).ravel(), np.tile(self.tag.astype(np.int32), P),
                       nel.astype(np.int64).ravel(), np.tile(self.dep_counts.astype(np.int32), P),
                       (base + self.dep_flat[None, :]).ravel(), dict(self.options))


@dataclass(eq=False)
class TokenMulticast:
    """A token-ring multicast allgather over hosts of ``ranks_per_host`` (R) ranks, rank =
    host * R + local; its roots are the hosts' leaders (local 0). R = 1 is ``mcast``: rank
    r copies its part, takes the token from r-1 unless it starts a sequence
    (``firsts[r]``), multicasts ``mcast_nelems`` elements, passes the token to r+1 unless
    r+1 starts one (``firsts[P]`` is set), then receives every other rank's stream
    (``parts[root]`` elements each). R > 1 is ``hmcast``: every local first sends its
    ``gather_nelems`` to its leader, the leaders run that token ring (``firsts`` and
    ``parts`` per host) once their locals' shards are in, and every rank but a stream's
    root receives it. P x H steps held as O(P) numbers; ``columns()`` builds them (the
    algorithm's vectorised generator)."""
    nranks: int
    mcast_nelems: int
    parts: np.ndarray         # (H,) elements of each root's stream as its receivers count
    firsts: np.ndarray        # (H + 1,) bool
    build: object             # () -> Columns
    options: dict = field(default_factory=dict)
    ranks_per_host: int = 1
    gather_nelems: int = 0    # elements each local sends its leader (R > 1)
    uses_multicast = True

    @property
    def nhosts(self) -> int:
        return self.nranks // self.ranks_per_host

    @property
    def nsteps(self) -> int:
        P, H = self.nranks, self.nhosts
        tokens = int((~self.firsts[:H]).sum()) + int((~self.firsts[1:]).sum())
        # copies, the gather's sends and receives, multicasts, tokens, every rank's MRECVs
        return P + 2 * (P - H) + H + tokens + P * H - H

    def held_per_rank(self) -> int:
        """8-byte values per rank held at once: a dozen P-wide arrays, and the trees of
        the streams in flight (the stream mode drops each tree once its stream is out)."""
        return 16

    def columns(self) -> Columns:
        return self.build()


@dataclass(eq=False)
class HostRing:
    """A hierarchical ring allgather (``hring``, one piece) over H hosts of R ranks, rank =
    host * R + local, every shard ``nelems`` elements: local j passes its shard and those
    it got from j+1 on to j-1 (the gather); the leaders (local 0) run a ring allgather of
    whole host blocks (R shards); local j-1 passes local j first its own host's shards
    0..j-1, then every block in the order the ring brings it (the broadcast). Every host
    runs one program up to a shift of R ranks: held as a few numbers, its P x (R + H)
    steps built by ``columns()`` (the algorithm's vectorised generator)."""
    nranks: int
    ranks_per_host: int
    nelems: int
    build: object             # () -> Columns
    options: dict = field(default_factory=dict)
    uses_multicast = False

    @property
    def nhosts(self) -> int:
        return self.nranks // self.ranks_per_host

    @property
    def nsteps(self) -> int:
        P, H, R = self.nranks, self.nhosts, self.ranks_per_host
        # copies; per host the gather's R(R-1)/2 messages, the ring's H-1 out of the
        # leader, the broadcast's H per hop; each a SEND and a RECV
        return P + 2 * H * (R * (R - 1) // 2 + (H - 1) + (R - 1) * H)

    def held_per_rank(self) -> int:
        """8-byte values per rank the stream mode holds at once: each rank's few channel,
        arrival and completion times (a dozen H-wide rows per local rank)."""
        return 16

    def columns(self) -> Columns:
        return self.build()


class CompactSchedule(Schedule):
    """A :class:`Schedule` given by its columns or by a form that holds them in O(P)
    (``form``: a :class:`Template`, :class:`TokenMulticast` or :class:`HostRing`, else
    None; its columns then built on first use); ``programs`` (the Step objects) are built
    by ``expand()`` -- the algorithm's own generator -- on first use."""

    def __init__(self, collective, algorithm, nranks, root, count, options,
                 columns: "Columns | Template | TokenMulticast | HostRing", expand) -> None:
        form = None if isinstance(columns, Columns) else columns
        for k, v in (("collective", collective), ("algorithm", algorithm), ("nranks", nranks),
                     ("root", root), ("count", count), ("options", options),
                     ("form", form), ("_expand", expand)):
            object.__setattr__(self, k, v)
        if form is None:
            object.__setattr__(self, "columns", columns)

    def __getattr__(self, name):
        if name == "columns":                       # a form's, when first asked for
            cols = self.form.columns()
            object.__setattr__(self, "columns", cols)
            return cols
        if name in ("programs", "layouts"):         # only when not built yet
            full = self._expand()
            object.__setattr__(self, "programs", full.programs)
            object.__setattr__(self, "layouts", full.layouts)
            return getattr(full, name)
        raise AttributeError(name)

    @property
    def uses_multicast(self) -> bool:
        if self.form is not None:
            return self.form.uses_multicast
        return self.columns.uses_multicast

    @property
    def nsteps(self) -> int:
        return self.form.nsteps if self.form is not None else self.columns.nsteps

    def __repr__(self) -> str:
        return f"CompactSchedule({self.describe()}, {self.nsteps} steps)"

    __hash__ = object.__hash__

    def __eq__(self, other) -> bool:
        return self is other


def block_lengths(layout) -> np.ndarray:
    """Elements of every block of an even layout (parts near-equal, pieces near-equal)."""
    p = np.arange(layout.parts, dtype=np.int64)
    n = layout.nelems
    lo, hi = p * n // layout.parts, (p + 1) * n // layout.parts
    w = (hi - lo)[:, None]
    s = np.arange(layout.sub, dtype=np.int64)[None, :]
    return ((s + 1) * w // layout.sub - s * w // layout.sub).ravel()
