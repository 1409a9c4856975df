"""Allgather algorithms. Every rank's ``send`` (count elements, cut into ``nchunks``
pieces) lands in part ``r`` of every rank's ``recv`` (P parts of ``nchunks`` pieces).

With ``counts`` (Allgatherv) rank r's send holds ``counts[r]`` elements and part r of recv
exactly that many: the same programs over uneven blocks (polycast.schedule.vector)."""

from __future__ import annotations

from ..schedule.ir import Layout, per_rank
from ..schedule.vector import vector_layouts
from .phases import Flow, chunk_blocks, pow2_below, recursive_doubling
from .registry import Spec, register


def _layouts(spec: Spec):
    k, P = spec.nchunks, spec.nranks
    if spec.counts is not None:
        return vector_layouts(spec.collective, P, spec.counts, k)
    return Layout(spec.count, 1, k), Layout(P * spec.count, P, k)


@register("allgather", "ring", "P-1 steps, each rank forwards one shard to its successor; "
          "sends and receives (P-1)S per rank", options=("counts",))
def ring(spec: Spec):
    P = spec.nranks
    send, recv = _layouts(spec)
    b = spec.builder("ring", send, recv)
    for r in range(P):
        b.copy(r, "send", b.blocks("send"), "recv", b.blocks("recv", r))
    # Chunks of a shard are pipelined: piece s may travel on while piece s+1 is in flight.
    for r in range(P):
        nxt, prv = (r + 1) % P, (r - 1) % P
        for i in range(P - 1):
            out_part, in_part = (r - i) % P, (r - i - 1) % P
            for blk_out, blk_in in zip(b.blocks("recv", out_part), b.blocks("recv", in_part)):
                b.send(r, nxt, "recv", (blk_out,))
                b.recv(r, prv, "recv", (blk_in,))
    return b.build()


@register("allgather", "mcast",
          "every rank multicasts its shard once (S sent per rank); `roots` streams at a "
          "time, handed on by tokens (SC24)", multicast=True, options=("roots", "counts"))
def mcast(spec: Spec):
    """Bandwidth-optimal allgather over multicast (specs/mcast-protocol.md).

    The ranks form ``roots`` sequences of consecutive ranks; the first of each sequence
    multicasts at once, each other rank after a token from its predecessor, so exactly
    ``roots`` streams run at a time.
    """
    P = spec.nranks
    roots = min(max(1, int(spec.opt("roots", 2))), P)
    send, recv = _layouts(spec)
    b = spec.builder("mcast", send, recv, roots=roots)
    firsts = {g * P // roots for g in range(roots)}
    for r in range(P):
        b.copy(r, "send", b.blocks("send"), "recv", b.blocks("recv", r))
        token = []
        if r not in firsts:
            token = [b.recv(r, r - 1)]
        m = b.mcast(r, "send", b.blocks("send"), deps=token)
        if r + 1 < P and r + 1 not in firsts:
            b.send(r, r + 1, deps=[m])
        for p in range(P):
            if p != r:
                b.mrecv(r, p, "recv", b.blocks("recv", p))
    return b.build()


@register("allgather", "recdoubling",
          "log2(P) exchanges with partners at doubling distance; any P (the ranks above the "
          "largest power of two fold into a partner first and get the result last)",
          options=("counts",))
def recdoubling(spec: Spec):
    """Recursive doubling. With P = p2 + rem (p2 a power of two), rank p2+i first hands its
    shard to rank i, the p2 ranks run recursive doubling (rank i < rem carrying two
    shards), and rank i finally sends rank p2+i everything else."""
    P, k = spec.nranks, spec.nchunks
    send, recv = _layouts(spec)
    b = spec.builder("recdoubling", send, recv)
    fl = Flow(b, ["recv"] * P, src=None)
    for r in range(P):
        b.copy(r, "send", b.blocks("send"), "recv", b.blocks("recv", r))
    p2 = pow2_below(P)
    for e in range(p2, P):
        fl.xfer(e, e - p2, b.blocks("recv", e))
    recursive_doubling(fl, [[v] + ([v + p2] if v + p2 < P else []) for v in range(p2)], k)
    for e in range(p2, P):
        fl.xfer(e - p2, e, b.parts("recv", [p for p in range(P) if p != e]))
    return b.build()


@register("allgather", "bruck", "ceil(log2 P) steps for any P: at distance 1, 2, 4... each "
          "rank passes on what it has; a final local rotation puts shards in rank order",
          options=("counts",))
def bruck(spec: Spec):
    """Bruck et al. Rank r collects shards in ``tmp`` in the order r, r+1, ... (mod P): at
    distance d it sends its first min(d, P-d) shards to rank r-d, which appends them; a
    final local copy rotates ``tmp`` into ``recv``."""
    P, k = spec.nranks, spec.nchunks
    send, recv = _layouts(spec)
    tmp = recv
    if spec.counts is not None:     # tmp part j of rank r holds rank r+j's shard
        tmp = per_rank(Layout.uneven([spec.counts[(r + j) % P] for j in range(P)], k)
                       for r in range(P))
    b = spec.builder("bruck", send, recv, tmp=tmp)
    for r in range(P):
        b.copy(r, "send", b.blocks("send"), "tmp", b.blocks("tmp", 0))
    d = 1
    while d < P:
        n = min(d, P - d)
        for s in range(k):
            out, into = chunk_blocks(range(n), k, s), chunk_blocks(range(d, d + n), k, s)
            for r in range(P):
                b.send(r, (r - d) % P, "tmp", out)
            for r in range(P):
                b.recv(r, (r + d) % P, "tmp", into)
        d *= 2
    for r in range(P):
        b.copy(r, "tmp", b.blocks("tmp"), "recv",
               b.parts("recv", [(r + i) % P for i in range(P)]))
    return b.build()


@register("allgather", "direct", "every rank sends its shard straight to every other rank "
          "(P-1 messages each, no forwarding)", options=("counts",))
def direct(spec: Spec):
    P = spec.nranks
    send, recv = _layouts(spec)
    b = spec.builder("direct", send, recv)
    for r in range(P):
        b.copy(r, "send", b.blocks("send"), "recv", b.blocks("recv", r))
    # Round i pairs r -> r+i so that no rank is everyone's first destination.
    for i in range(1, P):
        for r in range(P):
            dst = (r + i) % P
            b.send(r, dst, "send", b.blocks("send"))
            b.recv(dst, r, "recv", b.blocks("recv", r))
    return b.build()
