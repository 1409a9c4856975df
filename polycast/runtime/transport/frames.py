"""The framing every reliable transport uses: a fixed prefix, the engine's wire header, the
payload.

``prefix = <IQ``: the header length in bytes (or a driver-level kind, see below), then the
payload length in bytes. The header is opaque here (the engine's ``wire`` module packs and
parses it), so transports never depend on its fields.
"""

from __future__ import annotations

import struct

PREFIX = struct.Struct("<IQ")
PREFIX_NBYTES = PREFIX.size

# Driver-level frames (never seen by the engine) use header lengths from this range.
KIND_BASE = 0xFFFFFF00
KIND_DOORBELL = KIND_BASE + 1      # "look at your shared-memory rings"
KIND_BYE = KIND_BASE + 2           # orderly close: not a lost peer
KIND_FRAG_FIRST = KIND_BASE + 3    # shm: first piece of a message too big for one ring slot
KIND_FRAG_MORE = KIND_BASE + 4     # shm: a further piece
KIND_CMA = KIND_BASE + 5           # shm: a payload to read single-copy (runtime/transport/cma.py)
KIND_CMA_DONE = KIND_BASE + 6      # shm: "done reading your single-copy payloads" (their seqs)


def is_driver_kind(hdr_len: int) -> bool:
    return hdr_len >= KIND_BASE


def control_frame(kind: int) -> bytes:
    return PREFIX.pack(kind, 0)
