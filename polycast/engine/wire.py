"""The wire format: one fixed, versioned binary header for every message and datagram.

Layout (network byte order, ``HEADER_NBYTES`` = 44 bytes, then a 16-byte keyed BLAKE2b MAC
when a secret is configured, then ``length`` payload bytes)::

    magic u16 | version u8 | kind u8 | flags u8 | pad 3 | comm u32 | seq u32 | src u32 |
    tag u32 | stream u32 | offset u64 | length u32 | sig u32 | [mac 16 bytes]

Field meaning per kind:

============ ================== =============== ======================== ===================
kind         tag                stream          offset                   length
============ ================== =============== ======================== ===================
DATA         step tag (ordinal  0               0                        payload bytes
             of this pair's
             messages)
MCAST_DATA   chunk index        root's multicast byte offset of the chunk payload bytes
                                ordinal         within the stream
MCAST_EOS    number of chunks   ordinal         stream size in bytes     0
RECOVER_REQ  stream's root      ordinal         first byte wanted        bytes wanted (*)
RECOVER_DATA stream's root      ordinal         byte offset in stream    payload bytes
FIN          0                  0               0                        0
RTS          step tag           0               0                        payload bytes (*)
CTS          step tag           0               0                        0
ABORT        reason code        0               lost rank (PEER_LOST)    utf-8 reason text
P2P_DATA     user tag           0               0                        payload bytes
P2P_RTS      user tag           0               0                        payload bytes (*)
P2P_CTS      user tag           0               1: refused (too long)    receiver's room (*)
============ ================== =============== ======================== ===================

Point-to-point kinds (P2P_*) carry the sender's message number to that destination in
``seq`` (they are matched by source and tag, not by collective sequence) and no call
signature (``sig`` 0).

(*) RECOVER_REQ, RTS, P2P_RTS and a refusing P2P_CTS set the ``F_NO_PAYLOAD`` flag: its ``length`` is a count and no payload
follows, so framing stays uniform (read :attr:`Header.payload_nbytes` bytes after the header).
``sig`` always carries the sender's call signature; every kind but ABORT (whose point may be
that the calls differ) is checked against the posted call.

RTS ("ready to send") and CTS ("clear to send") are the rendezvous of a large DATA message:
the sender announces it with an RTS (its length checked like a DATA's) and sends the DATA
only once the receiver's CTS for the same (comm, seq, tag) came back. A receiver whose
RECV starts first sends that CTS unasked (the sender then needs no RTS).

A DATA with ``F_PULL`` is the RTS and the DATA in one: its payload stays in the sender's
memory until the receiver reads it (a transport that can read a peer's memory, the runtime's
single-copy descriptors), so a receiver whose RECV has not started may hold it unread, at
the cost of a header, as it would hold an RTS (engine/rendezvous.py).

The MAC (``flags & F_MAC``) is BLAKE2b(key=secret, digest_size=16) over the 44 header bytes
followed by the payload. :func:`parse_header` verifies it when the payload is in the same
buffer; a stream reader that gets the header first keeps ``header.mac`` and calls
:func:`verify_mac` once the payload is read.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from dataclasses import dataclass, field

from ..errors import ProtocolError

MAGIC = 0x5043          # "PC"
VERSION = 1
_FMT = struct.Struct("!HBBB3xIIIIIQII")
HEADER_NBYTES = _FMT.size           # 44
MAC_NBYTES = 16
MAX_PAYLOAD_NBYTES = 1 << 31        # one message never carries more (a sanity bound)

F_MAC = 0x01            # a MAC follows the header
F_NO_PAYLOAD = 0x02     # ``length`` is a count (RECOVER_REQ), no payload bytes follow
F_PULL = 0x04           # a DATA its receiver may hold unread until its RECV starts

_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF


class MsgKind(enum.IntEnum):
    DATA = 1            # point-to-point step payload, or a 0-byte token/control message
    MCAST_DATA = 2      # one multicast datagram (a chunk of a root's stream)
    MCAST_EOS = 3       # end of a root's stream (repeated eos_repeats times)
    RECOVER_REQ = 4     # "send me bytes [offset, offset+length) of stream (tag, stream)"
    RECOVER_DATA = 5    # the answer: those bytes
    FIN = 6             # "I hold all multicast data of this collective; I need nothing more"
    ABORT = 7           # the sender failed this collective; fail it too (reason code in tag)
    RTS = 8             # "I have a DATA of ``length`` bytes for your RECV (src, tag)"
    CTS = 9             # "send that DATA now": the answer to an RTS
    P2P_DATA = 10       # a point-to-point message (engine/p2p.py): seq = the sender's
    P2P_RTS = 11        # message number to this rank, tag = the user's tag
    P2P_CTS = 12

    def __str__(self) -> str:
        return self.name


class AbortReason(enum.IntEnum):
    MISMATCH = 1
    TIMEOUT = 2
    OVERFLOW = 3
    PEER_LOST = 4
    OTHER = 5
    INVALID = 6         # the sender's own arguments were bad: it never ran the call


class WireError(ProtocolError):
    """A message or datagram rejected by the parser. ``reason`` is a short key for stats."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}")


def header_nbytes(secret: bytes | None = None) -> int:
    """Bytes before the payload: the fixed header, plus the MAC when a secret is set."""
    return HEADER_NBYTES + (MAC_NBYTES if secret else 0)


@dataclass(frozen=True, slots=True)
class Header:
    kind: MsgKind
    comm: int = 0
    seq: int = 0
    src: int = 0
    tag: int = 0
    offset: int = 0
    length: int = 0
    sig: int = 0
    stream: int = 0
    flags: int = 0
    mac: bytes = field(default=b"", compare=False, repr=False)

    @property
    def payload_nbytes(self) -> int:
        """Payload bytes that follow the header on the wire (``length`` unless it is a count)."""
        return 0 if self.flags & F_NO_PAYLOAD else self.length

    def _fixed(self, flags: int) -> bytes:
        try:
            return _FMT.pack(MAGIC, VERSION, int(self.kind), flags, self.comm, self.seq,
                             self.src, self.tag, self.stream, self.offset, self.length,
                             self.sig)
        except struct.error as e:
            raise WireError("bad_field", f"header field out of range in {self!r}: {e}") from None

    def pack(self, secret: bytes | None = None, payload=b"") -> bytes:
        """The header bytes (with MAC over header + ``payload`` when ``secret`` is set).

        ``payload`` is a bytes-like object or a sequence of them (scatter-gather); it is
        only read for the MAC, and is not included in the result.
        """
        flags = self.flags & (F_NO_PAYLOAD | F_PULL)
        if not secret:
            return self._fixed(flags)
        fixed = self._fixed(flags | F_MAC)
        return fixed + _mac(secret, fixed, payload)


_SETTERS = tuple(getattr(Header, f).__set__ for f in Header.__slots__)
_new = object.__new__


def make_header(kind, comm, seq, src, tag, offset, length, sig, stream=0, flags=0) -> Header:
    """``Header(...)`` twice as fast (the engine's hot path): a frozen dataclass's __init__
    pays for ``object.__setattr__`` per field; slot descriptors are cheaper."""
    h = _new(Header)
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10 = _SETTERS
    s0(h, kind)
    s1(h, comm)
    s2(h, seq)
    s3(h, src)
    s4(h, tag)
    s5(h, offset)
    s6(h, length)
    s7(h, sig)
    s8(h, stream)
    s9(h, flags)
    s10(h, b"")
    return h


def _mac(secret: bytes, fixed: bytes | memoryview, payload) -> bytes:
    h = hashlib.blake2b(key=secret, digest_size=MAC_NBYTES)
    h.update(fixed)
    if isinstance(payload, (list, tuple)):
        for piece in payload:
            h.update(piece)
    elif payload is not None and len(payload):
        h.update(payload)
    return h.digest()


_KINDS = {int(k): k for k in MsgKind}
# Kinds whose ``length`` may be a count (F_NO_PAYLOAD): a refusing P2P_CTS says the room
# the receive had.
_COUNT_KINDS = (MsgKind.RECOVER_REQ, MsgKind.RTS, MsgKind.P2P_RTS, MsgKind.P2P_CTS)
_MCAST_DATA, _MCAST_EOS = MsgKind.MCAST_DATA, MsgKind.MCAST_EOS


def parse_header(data: bytes | bytearray | memoryview, secret: bytes | None = None) -> Header:
    """Parse and check a header; raise :class:`WireError` (a ProtocolError) with a reason.

    ``data`` holds at least the header (and MAC); if it also holds the whole payload the MAC
    is verified here, else the caller verifies it with :func:`verify_mac` after reading the
    payload. Checks: size, magic, version, kind, flags, payload bound, MAC presence/value.
    """
    try:
        n = len(data)
    except TypeError:
        raise WireError("malformed", f"expected bytes, got {type(data).__name__}") from None
    if n < HEADER_NBYTES:
        raise WireError("truncated", f"{n} bytes, a header needs {HEADER_NBYTES}")
    try:
        (magic, version, kind, flags, comm, seq, src, tag, stream, offset, length,
         sig) = _FMT.unpack_from(data, 0)
    except (struct.error, TypeError) as e:      # pragma: no cover - size checked above
        raise WireError("malformed", str(e)) from None
    k = _KINDS.get(kind)
    if (magic == MAGIC and version == VERSION and k is not None and not flags
            and not secret and length <= MAX_PAYLOAD_NBYTES):
        # the common case (no MAC, nothing odd) in one test
        return make_header(k, comm, seq, src, tag, offset, length, sig, stream, 0)
    if magic != MAGIC:
        raise WireError("bad_magic", f"magic 0x{magic:04x}, expected 0x{MAGIC:04x}")
    if version != VERSION:
        raise WireError("bad_version", f"version {version}, this polycast speaks {VERSION}")
    if k is None:
        raise WireError("bad_kind", f"kind {kind}; valid kinds: "
                        + ", ".join(f"{int(x)}={x.name}" for x in MsgKind))
    if flags & ~(F_MAC | F_NO_PAYLOAD | F_PULL):
        raise WireError("bad_flags", f"unknown flag bits 0x{flags:02x}")
    if flags & F_PULL and k is not MsgKind.DATA:
        raise WireError("bad_flags", f"{k} cannot be pulled: F_PULL is for DATA only")
    if flags & F_NO_PAYLOAD and k not in _COUNT_KINDS:
        raise WireError("bad_flags", f"{k} carries a payload: F_NO_PAYLOAD is for "
                        "RECOVER_REQ and RTS only")
    payload_nbytes = 0 if flags & F_NO_PAYLOAD else length
    if payload_nbytes > MAX_PAYLOAD_NBYTES:
        raise WireError("oversized", f"payload length {length} exceeds {MAX_PAYLOAD_NBYTES}")
    mac = b""
    if secret:
        if not flags & F_MAC:
            raise WireError("unauthenticated", "a secret is configured but the header has "
                            "no MAC")
        if n < HEADER_NBYTES + MAC_NBYTES:
            raise WireError("truncated", f"{n} bytes, a header with MAC needs "
                            f"{HEADER_NBYTES + MAC_NBYTES}")
        mac = bytes(data[HEADER_NBYTES:HEADER_NBYTES + MAC_NBYTES])
        start = HEADER_NBYTES + MAC_NBYTES
        if n >= start + payload_nbytes:
            want = _mac(secret, memoryview(data)[:HEADER_NBYTES],
                        memoryview(data)[start:start + payload_nbytes])
            if not hmac.compare_digest(want, mac):
                raise WireError("bad_mac", "message authentication failed")
    elif flags & F_MAC:
        raise WireError("unexpected_mac", "the header carries a MAC but no secret is "
                        "configured here (configure the same secret on every rank)")
    h = make_header(k, comm, seq, src, tag, offset, length, sig, stream, flags)
    if mac:
        _SETTERS[10](h, mac)
    return h


def verify_mac(header: Header, payload, secret: bytes | None) -> None:
    """Check ``header.mac`` against ``payload`` (stream readers: call after the payload)."""
    if not secret:
        return
    want = _mac(secret, header._fixed(header.flags), payload)
    if not hmac.compare_digest(want, header.mac):
        raise WireError("bad_mac", "message authentication failed")


def parse_datagram(data: bytes | bytearray | memoryview, secret: bytes | None = None
                   ) -> tuple[Header, memoryview]:
    """Parse one datagram: header (+ MAC) + exactly ``length`` payload bytes."""
    h = parse_header(data, secret)
    start = HEADER_NBYTES + MAC_NBYTES if secret else HEADER_NBYTES
    n = len(data)
    if n != start + h.length or h.flags & F_NO_PAYLOAD:
        raise WireError("bad_length", f"datagram of {n} bytes but its header announces "
                        f"{start} + {h.payload_nbytes}")
    kind = h.kind
    if kind is not _MCAST_DATA and kind is not _MCAST_EOS:
        raise WireError("bad_kind", f"{h.kind} is not a datagram kind "
                        "(MCAST_DATA or MCAST_EOS)")
    return h, memoryview(data)[start:]


def call_signature(collective: str, algorithm: str, count: int, root: int, nranks: int,
                   itemsize: int, dtype: str = "", op: str = "", options: dict | None = None
                   ) -> int:
    """32-bit signature of a collective call; ranks calling differently get different ones."""
    opts = ",".join(f"{k}={options[k]}" for k in sorted(options or {}))
    text = f"{collective}|{algorithm}|{count}|{root}|{nranks}|{itemsize}|{dtype}|{op}|{opts}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big")
