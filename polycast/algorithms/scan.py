"""Scan and exscan (MPI's inclusive and exclusive prefix reductions).

Rank r's ``recv`` gets ``x_0 op x_1 op ... op x_r`` (scan) or ``... op x_(r-1)`` (exscan;
rank 0's recv is not written). The op need not commute: a reducing step stores
``incoming op local`` (MPI's ``invec op inoutvec``), and every combination here joins the
run of ranks just left of what the rank holds, which the verifier checks. Buffers are
``count`` elements cut into ``nchunks`` pieces; each piece runs its own chain of steps, so
pieces pipeline.
"""

from __future__ import annotations

from ..schedule.ir import Layout
from .registry import Spec, register


def _rounds(P: int) -> list[int]:
    """Distances 1, 2, 4, ... below P."""
    out, d = [], 1
    while d < P:
        out.append(d)
        d <<= 1
    return out


def _recdoubling(spec: Spec, exclusive: bool):
    """Hillis-Steele: in the round at distance d every rank r sends what it holds of ranks
    (r-d, r] to rank r+d and receives ranks (r-2d, r-d] from rank r-d, which is exactly
    the run to the left of its own. ceil(log2 P) rounds, count elements per message.

    scan: recv holds the running window; it is sent, then the incoming run is reduced into
    it. exscan: the window ("acc", in tmp part 0 once it first grows; ``send`` before) and
    the result (recv) both take the incoming run, received once into tmp part 1."""
    P, k = spec.nranks, spec.nchunks
    one = Layout(spec.count, 1, k)
    tmp = Layout(2 * spec.count, 2, k) if exclusive and P > 2 else None
    b = spec.builder("recdoubling", one, one, tmp)
    rounds = _rounds(P)
    for r in range(P):
        for s in range(k):
            if not exclusive:
                b.copy(r, "send", (s,), "recv", (s,))
                for d in rounds:
                    if r + d < P:
                        b.send(r, r + d, "recv", (s,))
                    if r - d >= 0:
                        b.recv(r, r - d, "recv", (s,), reduce=True)
                continue
            acc = ("send", s)                    # the window (r-d, r], read-only at first
            got = False                          # recv holds a result
            for d in rounds:
                if r + d < P:
                    b.send(r, r + d, acc[0], (acc[1],))
                if r - d < 0:
                    continue
                grows = r + 2 * d < P            # the window is sent again later
                if not got and not grows:        # first and last incoming: it is the result
                    b.recv(r, r - d, "recv", (s,))
                    got = True
                    continue
                inc = ("tmp", k + s)             # tmp part 1
                b.recv(r, r - d, inc[0], (inc[1],))
                if inc[0] != "recv":
                    b.copy(r, "tmp", (inc[1],), "recv", (s,), reduce=got)
                got = True
                if grows:
                    if acc[0] == "send":
                        b.copy(r, "send", (s,), "tmp", (s,))
                        acc = ("tmp", s)
                    b.copy(r, "tmp", (inc[1],), "tmp", (acc[1],), reduce=True)
    return b.build()


def _linear(spec: Spec, exclusive: bool):
    """A chain: rank r receives the prefix of ranks 0..r-1 from r-1 and passes the prefix
    of 0..r to r+1. P-1 hops, one message per rank; pieces pipeline down the chain."""
    P, k = spec.nranks, spec.nchunks
    one = Layout(spec.count, 1, k)
    tmp = one if exclusive and P > 2 else None
    b = spec.builder("linear", one, one, tmp)
    for r in range(P):
        for s in range(k):
            if not exclusive:
                b.copy(r, "send", (s,), "recv", (s,))
                if r > 0:
                    b.recv(r, r - 1, "recv", (s,), reduce=True)
                if r + 1 < P:
                    b.send(r, r + 1, "recv", (s,))
                continue
            if r == 0:
                if P > 1:
                    b.send(r, 1, "send", (s,))
                continue
            b.recv(r, r - 1, "recv", (s,))
            if r + 1 < P:
                b.copy(r, "send", (s,), "tmp", (s,))
                b.copy(r, "recv", (s,), "tmp", (s,), reduce=True)
                b.send(r, r + 1, "tmp", (s,))
    return b.build()


@register("scan", "recdoubling", "Hillis-Steele: ceil(log2 P) rounds, each rank sending "
          "its running prefix to rank r+2^k; the op need not commute")
def scan_recdoubling(spec: Spec):
    return _recdoubling(spec, False)


@register("scan", "linear", "a chain 0 -> 1 -> ... -> P-1 passing the prefix on; P-1 hops, "
          "one message per rank, pipelined in nchunks pieces")
def scan_linear(spec: Spec):
    return _linear(spec, False)


@register("exscan", "recdoubling", "Hillis-Steele: ceil(log2 P) rounds; the incoming runs "
          "build the exclusive prefix and the window; the op need not commute")
def exscan_recdoubling(spec: Spec):
    return _recdoubling(spec, True)


@register("exscan", "linear", "a chain 0 -> 1 -> ... -> P-1 passing the prefix on; P-1 "
          "hops, pipelined in nchunks pieces")
def exscan_linear(spec: Spec):
    return _linear(spec, True)
