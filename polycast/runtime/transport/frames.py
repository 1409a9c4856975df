"""The framing every reliable transport uses: a fixed prefix, the engine's wire header, the
payload.

``prefix = <IQ``: the header length in bytes (or a driver-level kind, see below), then the
payload length in bytes. The header is opaque here (the engine's ``wire`` module packs and
parses it), so transports never depend on its fields.
"""

from __future__ import annotations

import struct

from . import layout as L

PREFIX = struct.Struct("<IQ")
PREFIX_NBYTES = PREFIX.size
assert PREFIX_NBYTES == L.PREFIX_NBYTES

# Driver-level frames (never seen by the engine) use header lengths from KIND_BASE up; what
# each is: ring_layout.h.
KIND_BASE = L.KIND_BASE
KIND_DOORBELL = L.KIND_DOORBELL
KIND_BYE = L.KIND_BYE
KIND_FRAG_FIRST = L.KIND_FRAG_FIRST
KIND_FRAG_MORE = L.KIND_FRAG_MORE
KIND_CMA = L.KIND_CMA
KIND_CMA_DONE = L.KIND_CMA_DONE


def is_driver_kind(hdr_len: int) -> bool:
    return hdr_len >= KIND_BASE


def control_frame(kind: int) -> bytes:
    return PREFIX.pack(kind, 0)
