"""Fuzzing (issue 14 item 5), the reduced run: the wire parser, the rendezvous store's
protocol and the engine's message handling take random and mutated inputs (hypothesis)
without a crash, a hang or a changed user buffer. The full run (100,000 inputs per target)
is bench/fuzz.py; the invariants are in tests/fuzz_targets.py."""

from __future__ import annotations

import random

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fuzz_targets as ft  # noqa: E402
from polycast.engine import wire  # noqa: E402

CORPUS = ft.wire_corpus()
FAST = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def mutated(draw, corpus=CORPUS):
    """A genuine message with byte edits, a truncation or an extension."""
    data = bytearray(draw(st.sampled_from(corpus)))
    for pos, byte in draw(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)),
                                   max_size=4)):
        if pos < len(data):
            data[pos] = byte
    cut = draw(st.integers(0, len(data) + 8))
    return bytes(data[:cut]) + draw(st.binary(max_size=8))


@settings(FAST, max_examples=1000)
@given(st.one_of(st.binary(max_size=120), mutated()))
def test_wire_parser_never_crashes_and_accepts_only_what_packs_back(data):
    ft.check_wire(data)


def test_wire_parser_accepts_the_genuine_corpus():
    """The fuzz corpus is genuine (so mutations start from messages that parse)."""
    outcomes = [ft.check_wire(d) for d in CORPUS]
    assert sum("header" in o for o in outcomes) == len(CORPUS)
    assert sum("datagram" in o for o in outcomes) == 4      # MCAST_DATA/EOS, +/- MAC


@pytest.fixture(scope="module")
def store():
    target = ft.StoreTarget()
    yield target
    target.close()


def test_store_refuses_clients_without_the_secret_and_survives_garbage(store):
    answer = st.one_of(st.binary(max_size=80), st.binary(min_size=32, max_size=80))
    run = settings(FAST, max_examples=400)(given(answer)(store.handshake))
    refused, answers = store.server.refused, store.answers
    run()
    store.healthy()
    # every complete answer was refused (none knows the secret); shorter ones just left
    assert store.answers - answers > 50
    assert store.server.refused - refused == store.answers - answers


_FRAME = st.tuples(st.sampled_from(ft.STORE_OPS), st.binary(max_size=12),
                   st.binary(max_size=24))


def test_store_protocol_survives_hostile_authenticated_and_tampered_frames(store):
    def one(frames, tamper_kind, flip):
        s, session = store.session()
        s.close()
        genuine = ft.genuine_frames(session, frames or [(ft.OP_GET, b"k", b"")])
        raw = genuine[0]
        if tamper_kind == "altered":
            raw = bytearray(raw)
            raw[flip % len(raw)] ^= 0x41
            tamper = [bytes(raw)]
        elif tamper_kind == "replayed":       # a frame of another session, or counter 0 again
            tamper = [raw, raw]
        else:
            tamper = [raw[:flip % len(raw)]]  # cut short, then the client leaves
        store.frames(frames, tamper)

    run = settings(FAST, max_examples=300)(given(
        st.lists(_FRAME, max_size=6), st.sampled_from(("altered", "replayed", "short")),
        st.integers(0, 1 << 16))(one))
    bad = store.server.bad_frames
    run()
    store.healthy()
    assert store.server.bad_frames > bad


@settings(FAST, max_examples=120)
@given(st.integers(0, 1 << 30), st.integers(0, 9), st.integers(5, 25))
def test_engine_survives_hostile_messages_and_datagrams(seed, which, n):
    """Insider messages on the reliable channel and mutated datagrams (no secret): never a
    crash, hang, changed send buffer or write outside a receive buffer."""
    rng = random.Random(seed)
    case = ft.EngineCase(which, secret=False, seed=seed)
    for k in range(n):
        h, payload = case.mutate_fields(rng, *case.genuine(rng))
        if rng.random() < 0.5:
            case.message(h, payload)
        else:
            case.datagram(ft.mutate(rng, case.datagram_from(h, payload or b"", False)))
        if k == n // 2:
            case.advance(rng.choice((0.0, 1e-5, 1e-3)))
    case.finish(exact=False)


@settings(FAST, max_examples=60)
@given(st.integers(0, 1 << 30), st.integers(0, 9), st.integers(5, 25))
def test_engine_under_a_secret_ignores_forged_datagrams_entirely(seed, which, n):
    rng = random.Random(seed)
    case = ft.EngineCase(which, secret=True, seed=seed)
    drops = case.world.engines[case.victim].stats.drops
    for k in range(n):
        h, payload = case.mutate_fields(rng, *case.genuine(rng))
        data = case.datagram_from(h, payload or b"", forge_mac=True)
        case.datagram(ft.mutate(rng, data) if rng.random() < 0.3 else data)
        if k == n // 2:
            case.advance(1e-5)
    assert sum(drops.values()) >= n
    assert case.finish(exact=True) == "exact"


def test_the_wire_fuzzer_mutates():
    rng = random.Random(0)
    outs = {ft.mutate(rng, CORPUS[0], CORPUS) for _ in range(200)}
    assert len(outs) > 150
    assert any(len(o) < wire.HEADER_NBYTES for o in outs)


def test_a_payload_kind_claiming_no_payload_is_refused():
    """Found by bench/fuzz.py: a DATA message with F_NO_PAYLOAD (so the channel framed no
    payload bytes) reached the engine, which delivered 0 bytes to a 16-element region and
    crashed the executor. The parser refuses it; the engine drops it if it gets one."""
    h = wire.make_header(wire.MsgKind.DATA, 0, 0, 0, 0, 0, 64, 1, 0, wire.F_NO_PAYLOAD)
    with pytest.raises(wire.WireError, match="F_NO_PAYLOAD"):
        wire.parse_header(h.pack())
    case = ft.EngineCase(4, secret=False)               # allreduce ring: rank 1 gets DATA
    h = wire.make_header(wire.MsgKind.DATA, 0, 0, 0, 0, 0, 64, case.sig, 0, wire.F_NO_PAYLOAD)
    case.world.inject_message(1, 0, h, b"")
    assert case.world.engines[1].stats.drops.get("bad_flags") == 1
    assert case.finish(exact=False) == "done"
