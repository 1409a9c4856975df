"""What the engine asks its driver to do.

The engine never touches memory, sockets or clocks. It returns lists of these actions; the
driver (the runtime's progress thread, or the simulator's event loop) carries them out in
order. Buffer positions are :class:`Region` s in *elements* of the request's buffers; the
driver knows each request's arrays (and dtype/itemsize), the simulator knows only sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PolycastError


@dataclass(frozen=True, slots=True)
class Region:
    """Elements of one buffer of one request: ``runs`` are ``[start, stop)`` ranges, in order;
    the payload of a message is their concatenation."""

    req: int
    buf: str                                # "send", "recv" or "tmp"
    runs: tuple[tuple[int, int], ...]
    nbytes: int                             # sum of run lengths x itemsize

    @property
    def nelems(self) -> int:
        return sum(b - a for a, b in self.runs)


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``header`` + the bytes of ``payload`` (or none) to ``peer`` over the reliable
    channel (shm or TCP), in order with other Sends to that peer. Call
    ``engine.on_send_done(token, now)`` once the payload's memory may be reused.

    ``data``: small engine-made payload bytes (an ABORT's reason text), sent after the
    header when ``payload`` is None. ``header.payload_nbytes`` is always what follows the
    header on the wire: ``payload.nbytes``, ``len(data)``, or 0."""

    peer: int
    header: object                          # polycast.engine.wire.Header
    payload: Region | None
    token: int
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class Multicast:
    """Send one datagram (header + payload bytes) to the communicator's multicast group,
    not before ``not_before`` (seconds, the driver's clock): the engine's pacing. Fire and
    forget: datagrams may be lost; the protocol recovers."""

    header: object                          # polycast.engine.wire.Header
    payload: Region | None
    not_before: float


@dataclass(frozen=True, slots=True)
class MulticastChunks:
    """(``EngineConfig.external_streams``) Send this rank's stream ``region`` as its MCAST_DATA
    datagrams, the driver building them: chunk ``i`` is elements ``[i*chunk_elems, ...)`` of
    the region (the concatenation of its runs), its header ``header`` with ``tag`` = i,
    ``offset`` = its byte offset and ``length`` = its bytes. Chunk ``i`` leaves not before
    ``not_before + i * chunk_seconds`` (the engine's pacing; 0: all at once). Fire and forget,
    as :class:`Multicast`; the engine counts the step done at the last chunk's time, so a
    chunk the driver cannot send by then must be sent from a copy."""

    header: object                          # polycast.engine.wire.Header (MCAST_DATA, tag 0)
    payload: Region
    itemsize: int
    chunk_elems: int
    nchunks: int
    not_before: float
    chunk_seconds: float


@dataclass(frozen=True, slots=True)
class Deliver:
    """Place a received payload (the opaque object the driver handed in) into ``region``:
    overwrite, or combine with the request's reduction op when ``reduce``."""

    payload: object
    region: Region
    reduce: bool


@dataclass(frozen=True, slots=True)
class Copy:
    """Local copy (or combine) of ``src`` into ``dst`` (equal element counts)."""

    src: Region
    dst: Region
    reduce: bool


@dataclass(frozen=True, slots=True)
class SetTimer:
    """Call ``engine.on_timer(timer, now)`` at ``deadline`` (seconds). Re-setting an id moves it."""

    timer: int
    deadline: float


@dataclass(frozen=True, slots=True)
class CancelTimer:
    timer: int


@dataclass(frozen=True, slots=True)
class Complete:
    """Request ``req`` is done: all its output is in place and its buffers may be reused."""

    req: int


@dataclass(frozen=True, slots=True)
class Fail:
    """Request ``req`` failed; raise ``error`` to the user. Its buffers may be reused."""

    req: int
    error: PolycastError


@dataclass(frozen=True, slots=True)
class OpenStream:
    """(``EngineConfig.external_streams``) This rank's MRECV of stream ``(root, ordinal)`` of
    collective ``seq`` started: its placer may write the stream's chunks into ``region``
    from now on and reports what it wrote with ``engine.on_stream_progress``. Chunk ``i``
    is elements ``[i*chunk_elems, (i+1)*chunk_elems)`` of the region (the concatenation of
    its runs); datagrams carry call signature ``sig``."""

    seq: int
    root: int
    ordinal: int
    sig: int
    region: Region
    chunk_elems: int
    nchunks: int


@dataclass(frozen=True, slots=True)
class StreamData:
    """(external streams) Bytes ``[offset, offset + len(payload))`` of an open stream reached
    the engine: by recovery (``recovered``), or a chunk's datagram it held before the stream
    opened. The placer writes them and reports them (``on_stream_progress(...,
    recovered=recovered)``): it is the stream's only writer."""

    seq: int
    root: int
    ordinal: int
    req: int
    offset: int
    payload: object
    recovered: bool = True


@dataclass(frozen=True, slots=True)
class CloseStream:
    """(external streams) Write nothing more into this stream: complete, or its request
    ``req`` ended."""

    seq: int
    root: int
    ordinal: int
    req: int


@dataclass(frozen=True, slots=True)
class Matched:
    """Receive ``req`` took the message of ``source`` with ``tag``, ``nbytes`` long
    (point-to-point: the receive's status). Comes before the Deliver or Copy that places
    it, so a driver whose receive had no buffer yet can make one of that size."""

    req: int
    source: int
    tag: int
    nbytes: int


Action = (Send | Multicast | MulticastChunks | Deliver | Copy | SetTimer | CancelTimer | Complete
          | Fail | OpenStream | StreamData | CloseStream | Matched)


_new = object.__new__


def _fast(cls):
    """A positional constructor for a frozen slots dataclass that skips the generated
    __init__'s per-field ``object.__setattr__`` (the engine's hot path makes millions)."""
    setters = tuple(getattr(cls, f).__set__ for f in cls.__slots__)
    n = len(setters)
    if n == 1:
        (a,) = setters

        def make(x):
            o = _new(cls)
            a(o, x)
            return o
    elif n == 2:
        a, b = setters

        def make(x, y):
            o = _new(cls)
            a(o, x)
            b(o, y)
            return o
    elif n == 3:
        a, b, c = setters

        def make(x, y, z):
            o = _new(cls)
            a(o, x)
            b(o, y)
            c(o, z)
            return o
    elif n == 4:
        a, b, c, d = setters

        def make(x, y, z, w):
            o = _new(cls)
            a(o, x)
            b(o, y)
            c(o, z)
            d(o, w)
            return o
    elif n == 5:
        a, b, c, d, e = setters

        def make(x, y, z, w, v):
            o = _new(cls)
            a(o, x)
            b(o, y)
            c(o, z)
            d(o, w)
            e(o, v)
            return o
    else:                                   # pragma: no cover - not used
        return cls
    return make


# Positional, all-fields constructors for the engine's modules (same objects as the classes
# make, without per-field __setattr__).
new_region = _fast(Region)
new_deliver = _fast(Deliver)
new_multicast = _fast(Multicast)
new_send = _fast(Send)
new_copy = _fast(Copy)
new_set_timer = _fast(SetTimer)
new_cancel_timer = _fast(CancelTimer)
new_complete = _fast(Complete)
