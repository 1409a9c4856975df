"""Work descriptors (rank -> offload process) and completions (back), as fixed-size structs.

Every descriptor starts with its kind byte. Variable parts (a pickled schedule, a member
list, an error's text, stats) travel as the frame's payload, never in the struct.

=========== ====================================================== =====================
kind        fields                                                 payload
=========== ====================================================== =====================
SCHEDULE    schedule id                                            pickled Schedule
POST        request, comm, schedule id, comm rank, itemsize,       -
            dtype, op, send and recv arena offsets and sizes
ADD_COMM    call id, comm, want multicast                          JSON member list
FREE_COMM   comm                                                   -
STATS       call id, comm                                          -
OFFLOAD_STA call id                                                 -
REFUSE      comm                                                   why (utf-8)
BYE         -                                                      -
DONE        request, status (0 ok), error class, lost rank         error text (utf-8)
REPLY       call id, ok                                            JSON answer or error
=========== ====================================================== =====================

Offsets are bytes into the posting rank's arena; -1 means "no buffer".
"""

from __future__ import annotations

import struct

from ...errors import (CollectiveTimeout, InvalidArgument, MismatchError, OffloadLost,
                       PeerLost, PolycastError, ProtocolError, Unsupported)

SCHEDULE, POST, ADD_COMM, FREE_COMM, STATS, BYE, OFFLOAD_STATS, REFUSE = 1, 2, 3, 4, 5, 6, 7, 8
DONE, REPLY = 16, 17

_SCHEDULE = struct.Struct("<BxxxI")
_POST = struct.Struct("<BxxxIQIIII16s16sqqqq")
_ADD_COMM = struct.Struct("<BBxxII")
_FREE_COMM = struct.Struct("<BxxxI")
_STATS = struct.Struct("<BxxxII")
_BYE = struct.Struct("<Bxxx")
_DONE = struct.Struct("<BBBxiQ")
_REPLY = struct.Struct("<BBxxI")


def kind_of(blob: bytes) -> int:
    return blob[0] if blob else 0


def schedule(sched_id: int) -> bytes:
    return _SCHEDULE.pack(SCHEDULE, sched_id)


def parse_schedule(blob: bytes) -> int:
    return _SCHEDULE.unpack_from(blob)[1]


def post(req: int, comm: int, sched_id: int, comm_rank: int, itemsize: int, dtype: str,
         op: str, send: tuple[int, int] | None, recv: tuple[int, int] | None) -> bytes:
    so, sn = send if send is not None else (-1, 0)
    ro, rn = recv if recv is not None else (-1, 0)
    return _POST.pack(POST, comm, req, sched_id, comm_rank, itemsize, 0,
                      dtype.encode(), op.encode(), so, sn, ro, rn)


def parse_post(blob: bytes) -> dict:
    (_, comm, req, sched_id, comm_rank, itemsize, _, dtype, op, so, sn, ro,
     rn) = _POST.unpack_from(blob)
    return {"req": req, "comm": comm, "sched_id": sched_id, "comm_rank": comm_rank,
            "itemsize": itemsize, "dtype": dtype.rstrip(b"\0").decode(),
            "op": op.rstrip(b"\0").decode(),
            "send": None if so < 0 else (so, sn), "recv": None if ro < 0 else (ro, rn)}


def add_comm(call: int, comm: int, want_mcast: bool) -> bytes:
    return _ADD_COMM.pack(ADD_COMM, int(want_mcast), call, comm)


def parse_add_comm(blob: bytes) -> tuple[int, int, bool]:
    _, want, call, comm = _ADD_COMM.unpack_from(blob)
    return call, comm, bool(want)


def free_comm(comm: int) -> bytes:
    return _FREE_COMM.pack(FREE_COMM, comm)


def parse_free_comm(blob: bytes) -> int:
    return _FREE_COMM.unpack_from(blob)[1]


def refuse(comm: int) -> bytes:
    """This rank will not run its next call on ``comm`` (Driver.refuse)."""
    return _FREE_COMM.pack(REFUSE, comm)


def stats(call: int, comm: int) -> bytes:
    return _STATS.pack(STATS, call, comm)


def parse_stats(blob: bytes) -> tuple[int, int]:
    _, call, comm = _STATS.unpack_from(blob)
    return call, comm


def offload_stats(call: int) -> bytes:
    """The offload process's own counters (CPU seconds, its workers'): a REPLY."""
    return _STATS.pack(OFFLOAD_STATS, call, 0)


def bye() -> bytes:
    return _BYE.pack(BYE)


# -- completions ----------------------------------------------------------------------------
# The error classes a completion can carry, so the rank raises what in-process progress
# would have raised (subclasses before their bases).
_ERRORS = [OffloadLost, Unsupported, InvalidArgument, MismatchError, PeerLost,
           CollectiveTimeout, ProtocolError, PolycastError]


def done(req: int, error: BaseException | None) -> tuple[bytes, bytes]:
    """A completion: (descriptor, payload)."""
    if error is None:
        return _DONE.pack(DONE, 0, 0, -1, req), b""
    code = next((i for i, cls in enumerate(_ERRORS) if isinstance(error, cls)),
                len(_ERRORS) - 1)
    lost = error.rank if isinstance(error, PeerLost) else -1
    text = str(error) if isinstance(error, PolycastError) else \
        f"the offload process failed: {error!r}"
    return _DONE.pack(DONE, 1, code, lost, req), text.encode("utf-8", "replace")


def parse_done(blob: bytes, payload: bytes) -> tuple[int, BaseException | None]:
    _, status, code, lost, req = _DONE.unpack_from(blob)
    if not status:
        return req, None
    text = payload.decode("utf-8", "replace")
    cls = _ERRORS[code] if code < len(_ERRORS) else PolycastError
    if cls is PeerLost:
        err = PeerLost(lost)
        err.args = (text,)          # the engine's full text, as in-process
        return req, err
    return req, cls(text)


def reply(call: int, ok: bool) -> bytes:
    return _REPLY.pack(REPLY, int(ok), call)


def parse_reply(blob: bytes) -> tuple[int, bool]:
    _, ok, call = _REPLY.unpack_from(blob)
    return call, bool(ok)


# -- the offload process and its multicast receive workers -----------------------------------
# Keys of a stream: (comm, seq, root, ordinal); ``rank`` is the world rank whose buffer a
# stream is placed into. Server -> worker: SETUP, MAP, JOIN, LEAVE, OPEN, DATA, CLOSE,
# WSTATS, STOP; worker -> server: ACK, PROGRESS, WSTATS (answer: JSON counters).
W_SETUP, W_MAP, W_JOIN, W_LEAVE, W_OPEN, W_DATA, W_CLOSE, W_STATS, W_STOP = range(32, 41)
W_ACK, W_PROGRESS = 48, 49
F_EOS, F_RECOVERED = 1, 2

_W_TOKEN = struct.Struct("<BxxxI")            # SETUP (JSON), MAP (JSON), STATS, ACK, STOP
_W_COMM = struct.Struct("<BxxxI")             # JOIN (JSON roots), LEAVE
_W_KEY = struct.Struct("<BBxxIIIII")          # kind, flags, rank, comm, seq, root, ordinal
_W_OPEN = struct.Struct("<BxxxIIIIIIIIIIqq")  # + sig, itemsize, chunk_elems, nchunks,
#                                               expected, nelems, base offset
_W_DATA = struct.Struct("<BxxxIIIIIq")        # + byte offset
_W_CLOSE = struct.Struct("<BxxxIIIIII")       # + token


def w_token(kind: int, token: int = 0) -> bytes:
    return _W_TOKEN.pack(kind, token)


def parse_w_token(blob: bytes) -> int:
    return _W_TOKEN.unpack_from(blob)[1]


def w_comm(kind: int, comm: int) -> bytes:
    return _W_COMM.pack(kind, comm)


def parse_w_comm(blob: bytes) -> int:
    return _W_COMM.unpack_from(blob)[1]


def w_open(rank: int, key: tuple, sig: int, itemsize: int, chunk_elems: int, nchunks: int,
           expected: int, nelems: int, base: int) -> bytes:
    return _W_OPEN.pack(W_OPEN, rank, *key, sig, itemsize, chunk_elems, nchunks, expected,
                        nelems, base)


def parse_w_open(blob: bytes) -> tuple:
    """(rank, key, sig, itemsize, chunk_elems, nchunks, expected, nelems, base)"""
    v = _W_OPEN.unpack_from(blob)
    return v[1], tuple(v[2:6]), v[6], v[7], v[8], v[9], v[10], v[11], v[12]


def w_data(rank: int, key: tuple, offset: int) -> bytes:
    return _W_DATA.pack(W_DATA, rank, *key, offset)


def parse_w_data(blob: bytes) -> tuple:
    v = _W_DATA.unpack_from(blob)
    return v[1], tuple(v[2:6]), v[6]


def w_close(rank: int, key: tuple, token: int) -> bytes:
    return _W_CLOSE.pack(W_CLOSE, rank, *key, token)


def parse_w_close(blob: bytes) -> tuple:
    v = _W_CLOSE.unpack_from(blob)
    return v[1], tuple(v[2:6]), v[6]


def w_progress(rank: int, key: tuple, flags: int) -> bytes:
    return _W_KEY.pack(W_PROGRESS, flags, rank, *key)


def parse_w_progress(blob: bytes) -> tuple:
    """(rank, key, flags)"""
    v = _W_KEY.unpack_from(blob)
    return v[2], tuple(v[3:7]), v[1]
