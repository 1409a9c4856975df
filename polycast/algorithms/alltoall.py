"""Alltoall algorithms: part p of rank r's ``send`` ends in part r of rank p's ``recv``
(both buffers P parts of count elements, each cut into ``nchunks`` pieces). With
``counts`` (Alltoallv, counts[i][j] elements from i to j) the parts are uneven."""

from __future__ import annotations

from ..schedule.ir import Layout
from ..schedule.vector import vector_layouts
from .registry import Spec, register


def _layouts(spec: Spec):
    if spec.counts is not None:
        return vector_layouts(spec.collective, spec.nranks, spec.counts, spec.nchunks)
    lay = Layout(spec.nranks * spec.count, spec.nranks, spec.nchunks)
    return lay, lay


@register("alltoall", "pairwise", "P-1 rounds; in round i rank r sends to r+i and "
          "receives from r-i, one round after the other; (P-1)/P of the buffer each way",
          options=("counts",))
def pairwise(spec: Spec):
    """Round i starts once round i-1's receive is done, as MPI's pairwise exchange (one
    sendrecv per round) does: it bounds the messages in flight to one per rank."""
    P = spec.nranks
    send, recv = _layouts(spec)
    b = spec.builder("pairwise", send, recv)
    for r in range(P):
        b.copy(r, "send", b.blocks("send", r), "recv", b.blocks("recv", r))
        prev = ()
        for i in range(1, P):
            to, frm = (r + i) % P, (r - i) % P
            b.send(r, to, "send", b.blocks("send", to), deps=prev)
            prev = (b.recv(r, frm, "recv", b.blocks("recv", frm)),)
    return b.build()


@register("alltoall", "bruck", "Bruck: ceil(log2 P) rounds, each moving about half the "
          "buffer to rank r+2^k; fewer messages, more bytes than pairwise")
def bruck(spec: Spec):
    """Rotate so ``tmp`` part j holds the data for rank r+j; in round k send every part j
    with bit k set to r+2^k (receiving the same parts from r-2^k in place, after the send
    has handed them off); then part j holds rank (r-j)'s data for r: copy it out."""
    P = spec.nranks
    # Whole parts move every round, so pieces would only multiply the block lists (each
    # round names half the parts): Bruck ignores nchunks.
    lay = Layout(P * spec.count, P, 1)
    b = spec.builder("bruck", lay, lay, lay if P > 1 else None)
    if P == 1:
        b.copy(0, "send", b.blocks("send"), "recv", b.blocks("recv"))
        return b.build()
    everything = b.parts("tmp", range(P))
    rounds = []
    dist = 1
    while dist < P:
        rounds.append((dist, b.parts("tmp", [j for j in range(P) if j & dist])))
        dist <<= 1
    for r in range(P):
        b.copy(r, "send", b.parts("send", [(r + j) % P for j in range(P)]), "tmp", everything)
        for dist, blocks in rounds:
            b.send(r, (r + dist) % P, "tmp", blocks)
            b.recv(r, (r - dist) % P, "tmp", blocks)
        b.copy(r, "tmp", everything, "recv", b.parts("recv", [(r - j) % P for j in range(P)]))
    return b.build()
