"""The wire format: round trips, and rejection of garbage, truncated, oversized, forged."""

from __future__ import annotations

import random

import pytest

from polycast.engine.engine import Engine, EngineConfig
from polycast.engine.wire import (F_NO_PAYLOAD, HEADER_NBYTES, MAC_NBYTES, Header, MsgKind,
                                  WireError, call_signature, header_nbytes, parse_datagram,
                                  parse_header, verify_mac)
from polycast.errors import InvalidArgument, ProtocolError

SECRET = b"sixteen byte key"


def hdr(**kw):
    base = dict(kind=MsgKind.MCAST_DATA, comm=7, seq=123456, src=3, tag=9, offset=1 << 40,
                length=5, sig=0xDEADBEEF, stream=2)
    base.update(kw)
    return Header(**base)


def test_sizes():
    assert HEADER_NBYTES == 44 and MAC_NBYTES == 16
    assert header_nbytes(None) == 44 and header_nbytes(SECRET) == 60
    assert len(hdr().pack()) == 44 and len(hdr().pack(SECRET, b"hello")) == 60


@pytest.mark.parametrize("kind", list(MsgKind))
def test_round_trip_every_kind(kind):
    h = hdr(kind=kind)
    assert parse_header(h.pack()) == h
    wire = h.pack(SECRET, b"hello") + b"hello"
    back = parse_header(wire, SECRET)
    assert (back.kind, back.comm, back.seq, back.src, back.tag, back.offset, back.length,
            back.sig, back.stream) == (kind, 7, 123456, 3, 9, 1 << 40, 5, 0xDEADBEEF, 2)


def test_datagram_round_trip_and_payload_view():
    h = hdr()
    wire = h.pack() + b"hello"
    back, payload = parse_datagram(wire)
    assert back == h and bytes(payload) == b"hello" and isinstance(payload, memoryview)
    back, payload = parse_datagram(h.pack(SECRET, b"hello") + b"hello", SECRET)
    assert bytes(payload) == b"hello"


def test_stream_reader_verifies_mac_after_payload():
    h = hdr(kind=MsgKind.DATA, length=3)
    head = h.pack(SECRET, [b"ab", b"c"])               # scatter-gather payload for the MAC
    parsed = parse_header(head, SECRET)                # header alone: MAC kept for later
    verify_mac(parsed, b"abc", SECRET)
    with pytest.raises(WireError, match="bad_mac"):
        verify_mac(parsed, b"abd", SECRET)


def test_recover_req_length_is_a_count_not_payload():
    h = hdr(kind=MsgKind.RECOVER_REQ, length=1 << 20, flags=F_NO_PAYLOAD)
    back = parse_header(h.pack())
    assert back.length == 1 << 20 and back.payload_nbytes == 0


@pytest.mark.parametrize("mutate,reason", [
    (lambda b: b[:10], "truncated"),
    (lambda b: b"", "truncated"),
    (lambda b: b"\x00\x00" + b[2:], "bad_magic"),
    (lambda b: b[:2] + b"\x09" + b[3:], "bad_version"),
    (lambda b: b[:3] + b"\x63" + b[4:], "bad_kind"),
    (lambda b: b[:4] + b"\x80" + b[5:], "bad_flags"),
])
def test_rejections(mutate, reason):
    with pytest.raises(WireError) as ei:
        parse_header(mutate(hdr().pack()))
    assert ei.value.reason == reason
    assert isinstance(ei.value, ProtocolError)


def test_bad_kind_message_lists_valid_kinds():
    with pytest.raises(ProtocolError, match="1=DATA, 2=MCAST_DATA"):
        parse_header(hdr().pack()[:3] + b"\x63" + hdr().pack()[4:])


def test_oversized_and_length_mismatch():
    with pytest.raises(WireError, match="oversized"):
        parse_header(hdr(length=0xFFFFFFFF).pack())
    with pytest.raises(WireError, match="bad_length"):
        parse_datagram(hdr(length=5).pack() + b"1234")
    with pytest.raises(WireError, match="bad_length"):
        parse_datagram(hdr(length=5).pack() + b"123456")
    with pytest.raises(WireError, match="not a datagram kind"):
        parse_datagram(hdr(kind=MsgKind.FIN, length=0).pack())


def test_mac_forged_missing_or_unexpected():
    good = hdr().pack(SECRET, b"hello") + b"hello"
    forged = bytearray(good)
    forged[-1] ^= 1                                    # payload altered in flight
    with pytest.raises(WireError, match="bad_mac"):
        parse_datagram(bytes(forged), SECRET)
    resigned = hdr().pack(b"another secret!!", b"hello") + b"hello"
    with pytest.raises(WireError, match="bad_mac"):
        parse_datagram(resigned, SECRET)
    with pytest.raises(WireError, match="unauthenticated"):
        parse_datagram(hdr().pack() + b"hello", SECRET)
    with pytest.raises(WireError, match="unexpected_mac"):
        parse_datagram(good)


def test_field_out_of_range_on_pack():
    with pytest.raises(WireError, match="bad_field"):
        hdr(src=-1).pack()
    with pytest.raises(WireError, match="bad_field"):
        hdr(seq=1 << 32).pack()


def test_random_garbage_never_raises_anything_else():
    rng = random.Random(5)
    base = hdr().pack() + b"hello"
    for i in range(3000):
        if i % 2:
            data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 80)))
        else:               # mutate a valid datagram in a few places
            data = bytearray(base)
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] = rng.getrandbits(8)
            data = bytes(data[:rng.randrange(len(data) + 1)])
        for secret in (None, SECRET):
            try:
                parse_datagram(data, secret)
            except ProtocolError:
                pass


def test_engine_counts_bad_datagrams_and_never_raises():
    e = Engine(1, 2, config=EngineConfig(secret=SECRET))
    rng = random.Random(1)
    for _ in range(500):
        assert e.on_datagram(bytes(rng.getrandbits(8) for _ in range(rng.randrange(60))),
                             0.0) == []
    assert e.on_datagram(hdr().pack() + b"hello", 0.0) == []          # no MAC
    assert e.on_datagram(hdr().pack(b"wrong key", b"hello") + b"hello", 0.0) == []
    assert e.stats.dropped == 502 and e.stats.datagrams_in == 502
    assert e.stats.drops["unauthenticated"] >= 1 and e.stats.drops["bad_mac"] >= 1
    assert e.stats.early_nbytes == 0


def test_call_signature_distinguishes_calls():
    a = call_signature("allgather", "ring", 10, 0, 4, 4, "float32", "")
    assert a == call_signature("allgather", "ring", 10, 0, 4, 4, "float32", "")
    others = {call_signature("allgather", "ring", 11, 0, 4, 4, "float32", ""),
              call_signature("allgather", "mcast", 10, 0, 4, 4, "float32", ""),
              call_signature("allgather", "ring", 10, 1, 4, 4, "float32", ""),
              call_signature("allgather", "ring", 10, 0, 4, 4, "int32", ""),
              call_signature("allgather", "ring", 10, 0, 4, 4, "float32", "sum"),
              call_signature("allgather", "ring", 10, 0, 4, 4, "float32", "", {"nchunks": 2})}
    assert a not in others and len(others) == 6


def test_config_rejects_bad_values():
    with pytest.raises(InvalidArgument, match="secret"):
        EngineConfig(secret="text").validate()
    with pytest.raises(InvalidArgument, match="eos_repeats"):
        EngineConfig(eos_repeats=0).validate()
