"""torch's point-to-point calls — ``send``/``recv``/``isend``/``irecv``, ``recv`` from
any source, and so ``batch_isend_irecv`` and pipeline stages' exchanges — as the group's
``Comm.Isend``/``Comm.Irecv`` (polycast's MPI matching, :mod:`polycast.comm.p2p`).

* torch's tag is the message tag: a receive takes the oldest message from its source
  with its tag (non-overtaking, as MPI and gloo); tags are 0..polycast.TAG_UB.
* Every call posts at once and returns; ``batch_isend_irecv`` is the same calls in list
  order, so the order of sends and receives in a batch cannot deadlock.
* The receiving tensor must be the message's size (torch's backends expect equal sizes):
  a longer message is MPI's truncation error, a shorter one an error here, both naming
  the sizes, on the receiving rank.
* Not collective: bad input raises on the calling rank only (as gloo does) and posts
  nothing; the peer's matching call then waits until the group's timeout.
"""

from __future__ import annotations

from ..errors import InvalidArgument, Unsupported
from .ops import Call, _one
from .tensors import raw


def _comm_p2p(call: Call):
    """The Comm's Isend/Irecv, or a clear error when this polycast has none."""
    comm = call.comm
    if not hasattr(comm, "Isend"):
        raise Unsupported(f"{call.what}: point-to-point needs polycast's Comm.Isend/Irecv, "
                          "not in this polycast version")
    return comm


def _peer(call: Call, peer, what: str) -> int:
    P = call.comm.size
    if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < P:
        raise InvalidArgument(f"{call.what}: {what} rank {peer!r} out of range for a group "
                              f"of {P} ranks (0..{P - 1})")
    return peer


def send(group, tensors, dst: int, tag: int):
    call = Call(group, f"send to rank {dst}, tag {tag}")
    comm = _comm_p2p(call)
    t = _one(tensors, "send")
    dst = _peer(call, dst, "destination")      # Comm checks the tag
    call.post(comm.Isend, raw(call.inp(t)), dst, tag)
    return call.work([t])


def recv(group, tensors, src: int | None, tag: int):
    """``src`` None: from any source (torch's ``recv_anysource``); the Work's
    ``source_rank()`` says whose message it took."""
    src_text = "any source" if src is None else f"rank {src}"
    call = Call(group, f"recv from {src_text}, tag {tag}")
    comm = _comm_p2p(call)
    t = _one(tensors, "recv")
    if src is not None:
        src = _peer(call, src, "source")
    from ..comm import ANY_SOURCE
    buf = call.out(t)
    data = raw(buf)
    call.post(comm.Irecv, data, ANY_SOURCE if src is None else src, tag)
    req = call.requests[-1]
    want = data.nbytes

    def whole_message():
        source, mtag, nbytes = req.status
        if nbytes != want:
            raise InvalidArgument(f"recv: the message from rank {source} (tag {mtag}) has "
                                  f"{nbytes} bytes, the tensor {want} ({t.dtype}"
                                  f"{list(t.shape)}): torch's recv needs equal sizes")
    call.first(whole_message)
    return call.work([t], source_rank=lambda: req.status[0] if req.status else -1)
