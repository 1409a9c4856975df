"""Allgather algorithms. Every rank's ``send`` (count elements, cut into ``nchunks``
pieces) lands in part ``r`` of every rank's ``recv`` (P parts of ``nchunks`` pieces)."""

from __future__ import annotations

from ..schedule.ir import Layout
from .registry import Spec, register


def _layouts(spec: Spec):
    k, P = spec.nchunks, spec.nranks
    return Layout(spec.count, 1, k), Layout(P * spec.count, P, k)


@register("allgather", "ring", "P-1 steps, each rank forwards one shard to its successor; "
          "sends and receives (P-1)S per rank")
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
          "time, handed on by tokens (SC24)", options=("roots",))
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
