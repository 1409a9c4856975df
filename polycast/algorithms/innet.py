"""In-network reduction (SHARP-like) algorithms, registered with ``innet=True``.

Their schedules are plain point-to-point schedules (the verifier proves them, the runtime
runs them as they are): every rank sends block p of its input straight to rank p, which
reduces the P-1 contributions. On a network whose switches reduce (the simulator), the
messages of one destination block are combined in the switches instead: each link of the
aggregation tree carries the block once, and the destination's downlink carries N/P
rather than (P-1)N/P.
"""

from __future__ import annotations

from ..schedule.ir import Layout
from .phases import mcast_round, parse_roots
from .registry import Spec, register


def _direct_reduce(b, P: int, src_buf: str, dst_buf: str) -> None:
    """Rank p ends with part p of ``dst_buf`` = op over every rank's part p of ``src_buf``.

    Pieces go one by one (``nchunks`` pipelining), in rounds r -> r+i so that no rank is
    everyone's first destination when the network does not reduce."""
    for r in range(P):
        b.copy(r, src_buf, b.blocks(src_buf, r), dst_buf, _dst_blocks(b, dst_buf, r))
    for i in range(1, P):
        for r in range(P):
            dst = (r + i) % P
            for blk_src, blk_dst in zip(b.blocks(src_buf, dst), _dst_blocks(b, dst_buf, dst)):
                b.send(r, dst, src_buf, (blk_src,))
                b.recv(dst, r, dst_buf, (blk_dst,), reduce=True)


def _dst_blocks(b, buf: str, part: int):
    lay = b.layouts[buf]
    return b.blocks(buf) if lay.parts == 1 else b.blocks(buf, part)


@register("reduce_scatter", "innet", "in-network reduction (SHARP-like): every rank sends "
          "part p to rank p and the switches combine them; each link carries a part once "
          "(elsewhere: the direct pattern)", innet=True)
def reduce_scatter(spec: Spec):
    P, k = spec.nranks, spec.nchunks
    b = spec.builder("innet", Layout(P * spec.count, P, k), Layout(spec.count, 1, k))
    _direct_reduce(b, P, "send", "recv")
    return b.build()


@register("allreduce", "innet", "in-network reduce-scatter (SHARP-like), then multicast "
          "allgather of the reduced parts: about N/P + N sent and N received per rank",
          innet=True, multicast=True, options=("roots",))
def allreduce(spec: Spec):
    P, k = spec.nranks, spec.nchunks
    roots = parse_roots(spec)
    lay = Layout(spec.count, P, k)
    b = spec.builder("innet", lay, lay, roots=roots)
    _direct_reduce(b, P, "send", "recv")
    mcast_round(b, list(range(P)), lambda r: b.blocks("recv", r), roots)
    return b.build()
