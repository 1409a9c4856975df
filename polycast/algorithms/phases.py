"""Phases that several generators share: ring reduce-scatter/allgather, recursive
halving/doubling, tree reduce/broadcast, chains, and the multicast allgather round.

Generators emit steps in one global order that is itself a valid execution (every message
is emitted when its data is ready); :class:`Flow` pairs each SEND with its RECV as it emits
them, so message ordinals always match, and tracks where each rank's current value of every
block lives so that nothing is ever written into ``send``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument, ScheduleError
from ..schedule.builder import Builder


class Flow:
    """Moves blocks between the ranks of one :class:`Builder`.

    ``home[rank]`` is the buffer a rank receives and accumulates into. With ``src="send"``
    (reductions, broadcast) every block starts out living only in ``send``: it is sent
    from there while untouched, and copied into ``home`` the first time something is
    reduced into it, so the read-only input is never written. With ``src=None`` (gathers)
    everything lives in ``home`` already. ``send``, ``tmp`` and ``recv`` of a flow with a
    source must be cut alike (block ``b`` means the same elements in each).
    """

    def __init__(self, b: Builder, home: list[str], src: str | None = "send") -> None:
        self.b, self.home, self.src = b, home, src
        n = b.layouts[src].nblocks if src else 0
        self.fresh = [bytearray(n) for _ in range(b.nranks)] if src else None

    def where(self, rank: int, blocks: tuple[int, ...]) -> str:
        """The buffer holding ``rank``'s current value of ``blocks`` (to send from)."""
        if self.src is None:
            return self.home[rank]
        f = self.fresh[rank]
        state = f[blocks[0]]
        for x in blocks:
            if f[x] != state:
                raise ScheduleError(f"{self.b.algorithm}: internal error, rank {rank} would "
                                    f"send blocks {blocks} that live in different buffers")
        return self.home[rank] if state else self.src

    def into(self, rank: int, blocks: tuple[int, ...]) -> str:
        """The buffer to reduce ``blocks`` into, copying them out of ``send`` first if
        they still live only there."""
        if self.src is not None:
            f = self.fresh[rank]
            stale = tuple(x for x in blocks if not f[x])
            if stale:
                self.b.copy(rank, self.src, stale, self.home[rank])
                for x in stale:
                    f[x] = 1
        return self.home[rank]

    def put(self, rank: int, blocks: tuple[int, ...]) -> str:
        """The buffer to overwrite ``blocks`` in (a final or forwarded value arrives)."""
        if self.src is not None:
            f = self.fresh[rank]
            for x in blocks:
                f[x] = 1
        return self.home[rank]

    def xfer(self, a: int, c: int, blocks: tuple[int, ...], reduce: bool = False) -> None:
        """One message ``a -> c`` of ``blocks`` (same block numbers on both sides)."""
        sbuf = self.where(a, blocks)
        self.b.send(a, c, sbuf, blocks)
        dbuf = self.into(c, blocks) if reduce else self.put(c, blocks)
        self.b.recv(c, a, dbuf, blocks, reduce)

    def round(self, msgs, reduce: bool = False) -> None:
        """Messages ``(a, c, blocks)`` that happen at once: all sends are emitted before
        any receive, so a rank that both sends and receives sends its value from before
        the round (an exchange never counts a contribution twice)."""
        b = self.b
        for a, c, blocks in msgs:
            b.send(a, c, self.where(a, blocks), blocks)
        for a, c, blocks in msgs:
            dbuf = self.into(c, blocks) if reduce else self.put(c, blocks)
            b.recv(c, a, dbuf, blocks, reduce)

    def finish(self, rank: int, blocks: tuple[int, ...], dst: str = "recv") -> None:
        """Make ``dst`` hold ``rank``'s current value of ``blocks`` (same block numbers)."""
        if self.src is None:
            if self.home[rank] != dst:
                self.b.copy(rank, self.home[rank], blocks, dst)
            return
        f = self.fresh[rank]
        stale = tuple(x for x in blocks if not f[x])
        if stale:
            self.b.copy(rank, self.src, stale, dst)
        if self.home[rank] != dst:
            done = tuple(x for x in blocks if f[x])
            if done:
                self.b.copy(rank, self.home[rank], done, dst)


def chunk_blocks(parts, k: int, s: int) -> tuple[int, ...]:
    """Block ``s`` of each of ``parts`` in a layout with ``k`` pieces per part."""
    return tuple(p * k + s for p in parts)


# --------------------------------------------------------------------------- rings


def ring_reduce_scatter(fl: Flow, ranks: list[int], seg, k: int) -> None:
    """Ring reduce-scatter among ``ranks`` (in ring order) over ``len(ranks)`` segments;
    ``seg(i, s)`` gives the blocks of piece ``s`` of segment ``i``. Afterwards
    ``ranks[i]`` holds segment ``i`` reduced over all of ``ranks``. Pieces pipeline."""
    n = len(ranks)
    for t in range(n - 1):
        for s in range(k):
            fl.round([(ranks[i], ranks[(i + 1) % n], seg((i - t - 1) % n, s))
                      for i in range(n)], reduce=True)


def ring_allgather(fl: Flow, ranks: list[int], seg, k: int) -> None:
    """Ring allgather among ``ranks``: ``ranks[i]`` starts with segment ``i`` and every rank
    ends with all segments (the counterpart of :func:`ring_reduce_scatter`)."""
    n = len(ranks)
    for t in range(n - 1):
        for s in range(k):
            fl.round([(ranks[i], ranks[(i + 1) % n], seg((i - t) % n, s))
                      for i in range(n)])


# --------------------------------------------------------------------------- halving/doubling


def pow2_below(n: int) -> int:
    """The largest power of two <= n (n >= 1)."""
    return 1 << (n.bit_length() - 1)


def recursive_halving(fl: Flow, groups: list[list[int]], k: int) -> None:
    """Recursive-halving reduce-scatter among ranks ``0..p2-1`` (p2 = len(groups), a power
    of two). ``groups[v]`` lists the parts of virtual part ``v``; afterwards rank ``v`` holds
    the parts of ``groups[v]`` reduced over the p2 ranks (whatever they had accumulated)."""
    p2 = len(groups)
    cur = [list(range(p2)) for _ in range(p2)]
    mask = p2 >> 1
    while mask:
        for s in range(k):
            msgs = []
            for r in range(p2):
                give = [p for v in cur[r] if (v & mask) != (r & mask) for p in groups[v]]
                msgs.append((r, r ^ mask, chunk_blocks(give, k, s)))
            fl.round(msgs, reduce=True)
        cur = [[v for v in cur[r] if (v & mask) == (r & mask)] for r in range(p2)]
        mask >>= 1


def recursive_doubling(fl: Flow, groups: list[list[int]], k: int) -> None:
    """Recursive-doubling allgather among ranks ``0..p2-1``: rank ``v`` starts with the parts
    of ``groups[v]`` and every rank ends with all of them."""
    p2 = len(groups)
    cur = [sorted(groups[r]) for r in range(p2)]
    mask = 1
    while mask < p2:
        for s in range(k):
            fl.round([(r, r ^ mask, chunk_blocks(cur[r], k, s)) for r in range(p2)])
        cur = [sorted(cur[r] + cur[r ^ mask]) for r in range(p2)]
        mask <<= 1


# --------------------------------------------------------------------------- trees


@dataclass(frozen=True)
class Shape:
    """A rooted tree over real ranks, ready to walk: parent and children per rank and a
    breadth-first order (parents before children)."""

    root: int
    parent: list[int]
    children: list[list[int]]
    order: list[int]


def shape(tree, relabel=None) -> Shape:
    """A :class:`Shape` from a :mod:`polycast.graph.trees` tree, optionally relabelling
    every rank ``v`` of the tree as ``relabel(v)``."""
    n = tree.nranks
    f = relabel or (lambda v: v)
    parent, children = [-1] * n, [[] for _ in range(n)]
    for v in range(n):
        p = tree.parent(v)
        parent[f(v)] = -1 if p < 0 else f(p)
        children[f(v)] = [f(c) for c in tree.children(v)]
    return Shape(f(tree.root), parent, children, [f(v) for v in tree.bfs_order()])


def tree_reduce(fl: Flow, t: Shape, blocks: tuple[int, ...]) -> None:
    """Reduce ``blocks`` up the tree to its root (children before parents, and each parent
    hears its last-listed, smallest, subtrees first)."""
    for r in reversed(t.order):
        if r != t.root:
            fl.xfer(r, t.parent[r], blocks, reduce=True)


def tree_broadcast(fl: Flow, t: Shape, blocks: tuple[int, ...], skip: int = -1) -> None:
    """Broadcast ``blocks`` from the root down the tree; rank ``skip`` (one that already
    holds the data) receives nothing but still forwards."""
    for r in t.order:
        for c in t.children[r]:
            if c != skip:
                fl.xfer(r, c, blocks)


def chain_reduce(fl: Flow, chain: list[int], blocks: tuple[int, ...]) -> None:
    """Reduce ``blocks`` along ``chain`` towards ``chain[0]`` (last rank first)."""
    for i in range(len(chain) - 1, 0, -1):
        fl.xfer(chain[i], chain[i - 1], blocks, reduce=True)


def chain_broadcast(fl: Flow, chain: list[int], blocks: tuple[int, ...]) -> None:
    """Forward ``blocks`` from ``chain[0]`` down the chain."""
    for i in range(1, len(chain)):
        fl.xfer(chain[i - 1], chain[i], blocks)


# --------------------------------------------------------------------------- multicast


def parse_roots(spec, default: int = 2) -> int:
    roots = spec.opt("roots", default)
    if isinstance(roots, bool) or not isinstance(roots, int) or roots < 1:
        raise InvalidArgument(f"roots must be a positive integer (concurrent multicast "
                              f"streams), got {roots!r}")
    return roots


def mcast_round(b: Builder, senders: list[int], blocks_of, roots: int,
                buf: str = "recv") -> None:
    """Each of ``senders`` multicasts ``blocks_of(rank)`` of ``buf`` once and every other
    rank receives it into the same blocks (specs/mcast-protocol.md).

    The senders form ``roots`` sequences of consecutive entries; the first of each starts
    at once, each other one after a token (a control message) from its predecessor, sent
    once the predecessor's stream is out, so ``roots`` streams run at a time.
    """
    n = len(senders)
    if n == 0 or b.nranks == 1:
        return
    roots = min(roots, n)
    firsts = {g * n // roots for g in range(roots)}
    for i, r in enumerate(senders):
        token = [] if i in firsts else [b.recv(r, senders[i - 1])]
        m = b.mcast(r, buf, blocks_of(r), deps=token)
        if i + 1 < n and i + 1 not in firsts:
            b.send(r, senders[i + 1], deps=[m])
    for r in range(b.nranks):
        for root in senders:
            if root != r:
                b.mrecv(r, root, buf, blocks_of(root))
