"""Barrier algorithms: no rank leaves before every rank has entered. No buffers; every
message is a control message."""

from __future__ import annotations

from .registry import Spec, register


@register("barrier", "dissemination", "ceil(log2 P) rounds; in round k rank r signals "
          "r+2^k and waits for r-2^k")
def dissemination(spec: Spec):
    """After round k a rank has heard, directly or through others, from the 2^(k+1) ranks
    before it, so after ceil(log2 P) rounds from all. Each round's signal waits for the
    previous round's, and each receive its own round's signal, making the rank's program a
chain (the data hazards the builder infers do not exist here)."""
    P = spec.nranks
    b = spec.builder("dissemination", None, None)
    for r in range(P):
        prev, dist = (), 1
        while dist < P:
            sig = b.send(r, (r + dist) % P, deps=prev)
            # The receive waits for this round's signal too, so what it learns adds to
            # what the rank knew: the next signal then vouches for all of it.
            prev = (b.recv(r, (r - dist) % P, deps=(sig,)),)
            dist <<= 1
    return b.build()
