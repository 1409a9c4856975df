"""Reduce-scatter algorithms. Every rank's ``send`` holds P parts (``count`` elements each,
cut into ``nchunks`` pieces); rank r ends with part r reduced over all ranks in ``recv``.
Partial sums are kept in ``tmp`` (a copy of ``send`` made lazily); ``send`` is read-only."""

from __future__ import annotations

from ..schedule.ir import Layout
from ..schedule.vector import vector_layouts
from .phases import Flow, chunk_blocks, pow2_below, recursive_halving, ring_reduce_scatter
from .registry import Spec, register


def _layouts(spec: Spec):
    k, P = spec.nchunks, spec.nranks
    if spec.counts is not None:         # Reduce_scatter with recvcounts: part p is counts[p]
        return vector_layouts(spec.collective, P, spec.counts, k)
    return Layout(P * spec.count, P, k), Layout(spec.count, 1, k)


def _setup(spec: Spec, name: str):
    send, recv = _layouts(spec)
    b = spec.builder(name, send, recv, tmp=send)
    return b, Flow(b, ["tmp"] * spec.nranks)


def _deliver(fl: Flow, rank: int, part: int) -> None:
    """Copy ``rank``'s reduced ``part`` (from tmp, or send when P = 1) into its recv."""
    b = fl.b
    blocks = b.blocks("send", part)
    b.copy(rank, fl.where(rank, blocks), blocks, "recv", b.blocks("recv"))


@register("reduce_scatter", "ring", "P-1 steps around the ring, each rank reducing one part "
          "into its partial sum and passing it on; sends (P-1)/P of the input per rank",
          options=("counts",))
def ring(spec: Spec):
    P, k = spec.nranks, spec.nchunks
    b, fl = _setup(spec, "ring")
    ring_reduce_scatter(fl, list(range(P)), lambda i, s: (i * k + s,), k)
    for r in range(P):
        _deliver(fl, r, r)
    return b.build()


@register("reduce_scatter", "rechalving",
          "log2(P) exchanges, halving the data each time; any P (the ranks above the "
          "largest power of two fold into a partner first and get their part last)",
          options=("counts",))
def rechalving(spec: Spec):
    """Recursive halving. With P = p2 + rem, rank p2+i first sends its whole input to rank
    i; the p2 ranks halve over virtual parts (rank i < rem also owning part p2+i); rank i
    finally sends rank p2+i its reduced part."""
    P, k = spec.nranks, spec.nchunks
    b, fl = _setup(spec, "rechalving")
    p2 = pow2_below(P)
    for e in range(p2, P):
        for s in range(k):
            fl.xfer(e, e - p2, chunk_blocks(range(P), k, s), reduce=True)
    recursive_halving(fl, [[v] + ([v + p2] if v + p2 < P else []) for v in range(p2)], k)
    for r in range(p2):
        _deliver(fl, r, r)
    for e in range(p2, P):
        blocks = b.blocks("send", e)
        b.send(e - p2, e, fl.where(e - p2, blocks), blocks)
        b.recv(e, e - p2, "recv", b.blocks("recv"))
    return b.build()


@register("reduce_scatter", "direct", "pairwise direct: each rank sends part p straight to "
          "rank p and reduces its own part from every other rank (P-1 messages each)",
          options=("counts",))
def direct(spec: Spec):
    P = spec.nranks
    send, recv = _layouts(spec)
    b = spec.builder("direct", send, recv)
    for r in range(P):
        b.copy(r, "send", b.blocks("send", r), "recv", b.blocks("recv"))
    # Round i pairs r -> r+i so that no rank is everyone's first destination.
    for i in range(1, P):
        for r in range(P):
            dst = (r + i) % P
            b.send(r, dst, "send", b.blocks("send", dst))
            b.recv(dst, r, "recv", b.blocks("recv"), reduce=True)
    return b.build()
